//! gyre-rdma: the transfer engine that moves large payloads (weights, KV
//! blocks, token rows) by handle instead of inline in messages: registered
//! segments and batched one-sided reads and writes, over TCP everywhere and
//! ibverbs where a NIC exists.
//!
//! Filled in by the transfer-engine work; for now the crate only fixes its
//! place in the dependency graph.

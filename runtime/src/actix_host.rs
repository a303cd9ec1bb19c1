//! actix adapter (in progress).

//! The GPU path of weight updates: NCCL broadcast from the trainer.
//!
//! On a GPU cluster an SGLang server takes new weights without touching
//! disk: `/init_weights_update_group` makes it join an NCCL group with the
//! trainer (the trainer is rank 0 of `world_size`; the server's ranks start
//! at `rank_offset`), then each `/update_weights_from_distributed` names
//! the tensors the trainer is about to broadcast over that group, in
//! order, with their dtypes and shapes, and labels the result with a
//! `weight_version`. Gyre's flat buffer maps onto it tensor by tensor
//! through its layout ([`DistributedTensors::of_layout`]: the checkpoint's
//! names and PyTorch shapes, F32). These calls need CUDA and NCCL on both
//! ends, so on CPU they are only checked for their request shapes (`gyre
//! serve` refuses both, naming the CPU endpoints to use instead).

use gyre_gpu::model::ParamLayout;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::client::SglangClient;
use super::error::SglangError;

/// SGLang's `InitWeightsUpdateGroupReqInput`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightsGroup {
    /// The trainer's rendezvous address and port (rank 0).
    pub master_address: String,
    pub master_port: u16,
    /// The server's first rank in the group.
    pub rank_offset: u32,
    /// Trainer plus every server rank.
    pub world_size: u32,
    pub group_name: String,
    /// `nccl`.
    pub backend: String,
}

impl WeightsGroup {
    /// A group of the trainer and one server of `tp` ranks.
    pub fn nccl(master_address: &str, master_port: u16, tp: u32) -> Self {
        Self {
            master_address: master_address.to_string(),
            master_port,
            rank_offset: 1,
            world_size: tp + 1,
            group_name: DEFAULT_GROUP.to_string(),
            backend: "nccl".to_string(),
        }
    }
}

/// SGLang's default group name.
pub const DEFAULT_GROUP: &str = "weight_update_group";

/// The tensors one broadcast carries, in broadcast order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistributedTensors {
    pub names: Vec<String>,
    pub dtypes: Vec<String>,
    pub shapes: Vec<Vec<usize>>,
}

impl DistributedTensors {
    /// Every tensor of Gyre's layout, as F32 (`float32`), in layout order.
    pub fn of_layout(layout: &ParamLayout) -> Self {
        Self {
            names: layout.specs.iter().map(|s| s.name.clone()).collect(),
            dtypes: vec!["float32".to_string(); layout.specs.len()],
            shapes: layout.specs.iter().map(|s| s.shape.clone()).collect(),
        }
    }
}

/// `/init_weights_update_group`'s body.
pub fn init_group_body(g: &WeightsGroup) -> serde_json::Value {
    json!(g)
}

/// `/update_weights_from_distributed`'s body (requests keep running:
/// `abort_all_requests: false`, see radixark/miles#2372).
pub fn update_distributed_body(
    t: &DistributedTensors,
    group_name: &str,
    weight_version: Option<&str>,
) -> serde_json::Value {
    json!({
        "names": t.names,
        "dtypes": t.dtypes,
        "shapes": t.shapes,
        "group_name": group_name,
        "flush_cache": true,
        "abort_all_requests": false,
        "weight_version": weight_version,
    })
}

impl SglangClient {
    /// The server joins the trainer's NCCL group.
    pub async fn init_weights_update_group(&self, g: &WeightsGroup) -> Result<(), SglangError> {
        self.control("/init_weights_update_group", init_group_body(g))
            .await
            .map(drop)
    }

    /// Announces a broadcast of `t` over `group_name`; the server receives
    /// it and serves it as `weight_version`.
    pub async fn update_weights_from_distributed(
        &self,
        t: &DistributedTensors,
        group_name: &str,
        weight_version: Option<&str>,
    ) -> Result<(), SglangError> {
        let body = update_distributed_body(t, group_name, weight_version);
        self.control("/update_weights_from_distributed", body)
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_gpu::model::ModelConfig;

    /// SGLang's documented request (python/sglang/srt/managers/io_struct.py,
    /// `InitWeightsUpdateGroupReqInput`), as its tests send it.
    #[test]
    fn init_group_has_sglangs_fields() {
        let g = WeightsGroup::nccl("10.0.0.1", 29500, 2);
        let want = serde_json::json!({
            "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1,
            "world_size": 3, "group_name": "weight_update_group", "backend": "nccl"
        });
        assert_eq!(init_group_body(&g), want);
    }

    /// `UpdateWeightsFromDistributedReqInput`: parallel lists of names,
    /// dtypes and shapes, the group, and the version label.
    #[test]
    fn a_distributed_update_names_every_tensor_of_the_layout() {
        let layout = ParamLayout::new(&ModelConfig::tiny()).unwrap();
        let t = DistributedTensors::of_layout(&layout);
        let body = update_distributed_body(&t, DEFAULT_GROUP, Some("7"));
        let n = layout.specs.len();
        assert_eq!(body["names"].as_array().unwrap().len(), n);
        assert_eq!(body["dtypes"][0], "float32");
        assert_eq!(body["names"][0], layout.specs[0].name.as_str());
        assert_eq!(body["shapes"][0], serde_json::json!(layout.specs[0].shape));
        let total: usize = t.shapes.iter().map(|s| s.iter().product::<usize>()).sum();
        assert_eq!(total, layout.total, "the broadcast covers the whole buffer");
        assert_eq!(body["group_name"], "weight_update_group");
        assert_eq!(body["weight_version"], "7");
        assert_eq!(body["abort_all_requests"], false);
        assert_eq!(body["flush_cache"], true);
    }
}

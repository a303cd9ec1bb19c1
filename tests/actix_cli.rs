//! `gyre train --host actix`: the whole embedded cluster on the actix
//! adapter from the command line, reporting as the live host does.
#![cfg(feature = "actix")]

mod common;
use common::{ok, versions};

#[test]
fn a_tiny_run_trains_on_the_actix_host_from_the_cli() {
    let out = ok(&[
        "train", "--tiny", "--steps", "5", "--host", "actix", "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(r["steps"], 5);
    let versions = versions(&r);
    assert_eq!(versions, [1, 2, 3, 4, 5], "every update, once, in order");
    for u in r["updates"].as_array().unwrap() {
        assert!(
            u["targets"].as_u64().unwrap() > 0,
            "each update trained: {u}"
        );
    }
    assert!(r["scored"].as_u64().unwrap() > 0);
}

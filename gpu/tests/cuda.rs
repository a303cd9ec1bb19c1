//! CUDA device memory and NCCL (feature `cuda`). On a machine without a
//! driver each test says so and returns, unless GYRE_REQUIRE_CUDA=1 (set by
//! `gpu/check.sh`), which turns a missing driver into a failure.
#![cfg(feature = "cuda")]

use gyre_gpu::collective::Collective;
use gyre_gpu::collective::nccl::{NcclComm, nccl_present, new_id};
use gyre_gpu::memory::cuda::{CudaBackend, driver_present};
use gyre_gpu::memory::{DeviceMemory, Keep, MemoryError, Role, Tag};

fn required() -> bool {
    std::env::var("GYRE_REQUIRE_CUDA").is_ok_and(|v| v == "1")
}

fn gpu(test: &str) -> Option<CudaBackend> {
    if !driver_present() {
        assert!(
            !required(),
            "{test}: GYRE_REQUIRE_CUDA=1 but no CUDA driver can be loaded"
        );
        eprintln!("{test}: skipped, no CUDA driver on this machine");
        return None;
    }
    Some(CudaBackend::new(0).unwrap())
}

#[test]
fn a_missing_driver_is_an_error_not_a_panic() {
    match CudaBackend::new(0) {
        Ok(b) => assert!(driver_present() && !b.device_name().unwrap().is_empty()),
        Err(e) => {
            assert!(!required(), "GYRE_REQUIRE_CUDA=1 but: {e}");
            assert!(matches!(e, MemoryError::NoDriver(_)), "{e}");
        }
    }
    if driver_present() {
        assert!(matches!(
            CudaBackend::new(1 << 20),
            Err(MemoryError::NoDriver(_))
        ));
    }
}

#[test]
fn regions_by_tag_release_and_restore_on_the_device() {
    let Some(dev) = gpu("regions_by_tag_release_and_restore_on_the_device") else {
        return;
    };
    let mut m = DeviceMemory::new(dev);
    let n = 1 << 20;
    let w: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    m.allocate(Tag::RolloutWeights, n).unwrap();
    m.allocate(Tag::KvCache, n / 2).unwrap();
    m.write(Tag::RolloutWeights, 0, &w).unwrap();
    m.write(Tag::KvCache, 0, &vec![1.0; n / 2]).unwrap();
    assert_eq!(m.report().resident, 6 * n as u64);
    m.release_role(Role::Rollout, |t| {
        if t == Tag::KvCache {
            Keep::Discard
        } else {
            Keep::Backup
        }
    })
    .unwrap();
    assert_eq!(m.report().resident, 0);
    m.allocate(Tag::TrainParams, n).unwrap();
    m.free(Tag::TrainParams).unwrap();
    m.restore_role(Role::Rollout).unwrap();
    assert_eq!(m.read_all(Tag::RolloutWeights).unwrap(), w);
    assert!(m.read_all(Tag::KvCache).unwrap().iter().all(|&x| x == 0.0));
    let r = m.report();
    assert_eq!((r.backend, r.peak), ("cuda", 6 * n as u64));
    eprintln!("{r}");
}

#[test]
fn host_device_copies_at_offsets() {
    let Some(dev) = gpu("host_device_copies_at_offsets") else {
        return;
    };
    let mut m = DeviceMemory::new(dev);
    m.allocate(Tag::Gradients, 1000).unwrap();
    let src: Vec<f32> = (0..300).map(|i| (i as f32).sin()).collect();
    m.write(Tag::Gradients, 700, &src).unwrap();
    let mut back = vec![0.0; 300];
    m.read(Tag::Gradients, 700, &mut back).unwrap();
    assert_eq!(back, src);
    let mut head = vec![1.0; 700];
    m.read(Tag::Gradients, 0, &mut head).unwrap();
    assert!(head.iter().all(|&x| x == 0.0));
    assert!(matches!(
        m.write(Tag::Gradients, 701, &src),
        Err(MemoryError::OutOfRange { .. })
    ));
}

#[test]
fn nccl_all_reduce_and_broadcast() {
    let Some(dev) = gpu("nccl_all_reduce_and_broadcast") else {
        return;
    };
    assert!(
        nccl_present() || !required(),
        "GYRE_REQUIRE_CUDA=1 but libnccl cannot be loaded"
    );
    if !nccl_present() {
        eprintln!("nccl_all_reduce_and_broadcast: skipped, no libnccl");
        return;
    }
    // One rank per visible GPU, each on its own thread.
    let count = cudarc::driver::CudaContext::device_count().unwrap() as usize;
    let id = new_id().unwrap();
    let results: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..count)
            .map(|rank| {
                let id = id.clone();
                s.spawn(move || {
                    let stream = dev_stream(rank);
                    let comm = NcclComm::join(stream.clone(), rank, count, &id).unwrap();
                    let mut b = vec![rank as f32 + 1.0; 4096];
                    comm.all_reduce_sum(&mut b).unwrap();
                    let mut c = vec![rank as f32; 8];
                    comm.broadcast(&mut c, 0).unwrap();
                    let mut d = stream.clone_htod(&[2.0f32; 16]).unwrap();
                    comm.all_reduce_device(&mut d).unwrap();
                    let d = stream.clone_dtoh(&d).unwrap();
                    b.truncate(1);
                    b.extend(c);
                    b.push(d[0]);
                    b
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(dev);
    let sum = (count * (count + 1) / 2) as f32;
    for r in results {
        assert_eq!(r[0], sum);
        assert!(r[1..9].iter().all(|&x| x == 0.0));
        assert_eq!(r[9], 2.0 * count as f32);
    }
}

fn dev_stream(ordinal: usize) -> std::sync::Arc<cudarc::driver::CudaStream> {
    CudaBackend::new(ordinal).unwrap().stream().clone()
}

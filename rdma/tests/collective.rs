//! Ring all-reduce and broadcast over the transfer engine, each rank on its
//! own thread with its own engine, linked by authenticated TCP.

use std::thread;

use gyre_rdma::collective::{Group, RingAllReduce, ring_order_sum};
use gyre_rdma::{ClusterSecret, TcpOptions, TcpServer, TransferEngine};

/// `n` ranks, each listening and connected to every other.
fn mesh(n: usize, tag: &str) -> (Vec<Group>, Vec<TcpServer>) {
    let secret = ClusterSecret::new("collective-test-secret").unwrap();
    let engines: Vec<_> = (0..n)
        .map(|i| TransferEngine::new(&format!("rank{i}")))
        .collect();
    let servers: Vec<_> = engines
        .iter()
        .map(|e| e.listen_tcp("127.0.0.1:0", &secret).unwrap())
        .collect();
    let opts = TcpOptions {
        connections: 2,
        stripe_bytes: 32 << 10,
    };
    let groups = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let peers = (0..n)
                .map(|j| {
                    (j != i).then(|| {
                        e.connect_tcp(servers[j].local_addr(), &secret, opts)
                            .unwrap()
                    })
                })
                .collect();
            Group::new(e.clone(), i, peers, tag).unwrap()
        })
        .collect();
    (groups, servers)
}

/// Small integers, so every summation order gives the exact same f32.
fn gradient(rank: usize, call: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13 + call * 3) % 101) as f32 - 50.0)
        .collect()
}

fn run_all_reduce(groups: Vec<Group>, len: usize, calls: usize) {
    let n = groups.len();
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            thread::spawn(move || {
                let rank = g.rank;
                let mut ring = RingAllReduce::new(g, len).unwrap();
                (0..calls)
                    .map(|call| {
                        let mut v = gradient(rank, call, len);
                        ring.all_reduce(&mut v).unwrap();
                        v
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<Vec<Vec<f32>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for call in 0..calls {
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| gradient(r, call, len)).collect();
        let expected: Vec<f32> = (0..len)
            .map(|i| inputs.iter().map(|g| g[i]).sum())
            .collect();
        for (rank, r) in results.iter().enumerate() {
            assert_eq!(r[call], expected, "n={n} len={len} call={call} rank={rank}");
        }
    }
}

#[test]
fn ring_all_reduce_over_two_to_four_ranks_equals_the_sum() {
    for n in 2..=4 {
        // Lengths not divisible by n, shorter than n, and spanning stripes.
        for len in [1, 3, 1001, 40_000] {
            let (groups, _servers) = mesh(n, &format!("ar{n}-{len}"));
            run_all_reduce(groups, len, 3);
        }
    }
}

/// Values whose sums depend on the order they are added in.
fn rounding_gradient(rank: usize, len: usize) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(rank as u64 * 7919 + len as u64);
    (0..len)
        .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-6..6)))
        .collect()
}

#[test]
fn the_ring_sums_in_its_pinned_order_bit_for_bit() {
    for n in 2..=4 {
        let len = 1001;
        let (groups, _servers) = mesh(n, &format!("order{n}"));
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| {
                thread::spawn(move || {
                    let mut v = rounding_gradient(g.rank, len);
                    let mut ring = RingAllReduce::new(g, len).unwrap();
                    ring.all_reduce(&mut v).unwrap();
                    (v, ring.bytes_written())
                })
            })
            .collect();
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| rounding_gradient(r, len)).collect();
        let parts: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let expected = ring_order_sum(&parts);
        let in_rank_order: Vec<f32> = (0..len)
            .map(|i| inputs.iter().skip(1).fold(inputs[0][i], |a, g| a + g[i]))
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for h in handles {
            let (got, written) = h.join().unwrap();
            assert_eq!(bits(&got), bits(&expected), "n={n}");
            // 2(n−1) chunks of about len/n values, 4 bytes each.
            assert!(
                written >= (2 * (n - 1) * (len / n) * 4) as u64,
                "n={n}: {written}"
            );
        }
        if n == 2 {
            assert_eq!(
                bits(&expected),
                bits(&in_rank_order),
                "two ranks: plain order"
            );
        } else {
            assert_ne!(
                bits(&expected),
                bits(&in_rank_order),
                "n={n}: the order matters here"
            );
        }
    }
}

#[test]
fn a_prefix_of_the_participants_reduces_among_itself() {
    let (groups, _servers) = mesh(4, "grads");
    let prefix: Vec<Group> = groups.iter().filter_map(|g| g.prefix(3)).collect();
    assert_eq!(prefix.len(), 3, "rank 3 is outside the prefix of 3");
    assert!(groups[3].prefix(3).is_none());
    run_all_reduce(prefix, 777, 2);
}

#[test]
fn too_long_gradients_are_refused() {
    let (groups, _servers) = mesh(2, "small");
    let mut handles = Vec::new();
    for g in groups {
        handles.push(thread::spawn(move || {
            let mut ring = RingAllReduce::new(g, 10).unwrap();
            ring.all_reduce(&mut [0.0; 11]).unwrap_err().to_string()
        }));
    }
    for h in handles {
        assert!(h.join().unwrap().contains("11 values exceed the 10"));
    }
}

#[test]
fn broadcast_delivers_the_roots_parameters_to_every_member() {
    let (groups, _servers) = mesh(4, "params");
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            thread::spawn(move || {
                (0..2u64)
                    .map(|call| {
                        let mut params = if g.rank == 1 {
                            (0..100_000).map(|i| i as f32 * 0.5 + call as f32).collect()
                        } else {
                            Vec::new()
                        };
                        g.broadcast_f32(1, call, &mut params).unwrap();
                        params
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        let got = h.join().unwrap();
        for (call, params) in got.iter().enumerate() {
            let expected: Vec<f32> = (0..100_000).map(|i| i as f32 * 0.5 + call as f32).collect();
            assert_eq!(params, &expected);
        }
    }
}

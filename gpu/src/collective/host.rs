//! In-memory collectives for cells that are threads of one process: a
//! reusable rendezvous where members deposit their buffers, the last one
//! to arrive completes the round, and everyone copies the result out.
//! A member that never arrives makes the others fail after a timeout
//! rather than hang; a member that brings a wrong length fails the round
//! for all. A failed group stays failed (as an aborted NCCL communicator
//! does): build a new one.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Collective, CollectiveError};

#[derive(Default)]
struct Round {
    /// Completed rounds; a member waits for this to move past its own.
    generation: u64,
    arrived: usize,
    departed: usize,
    draining: bool,
    acc: Option<Vec<f32>>,
    failed: Option<CollectiveError>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    round: Mutex<Round>,
    cv: Condvar,
}

/// Builds the members of one group.
pub struct HostGroup;

impl HostGroup {
    /// `size` handles, rank 0..size; hand one to each member.
    pub fn members(size: usize, timeout: Duration) -> Vec<HostComm> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            round: Mutex::new(Round::default()),
            cv: Condvar::new(),
        });
        (0..size)
            .map(|rank| HostComm {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

/// One member's handle.
#[derive(Clone)]
pub struct HostComm {
    rank: usize,
    shared: Arc<Shared>,
}

enum Op {
    Sum,
    Broadcast(usize),
}

impl HostComm {
    fn lock(&self) -> MutexGuard<'_, Round> {
        // A panic on another member's thread poisons the lock; the data is
        // a plain buffer, still usable, and the round's own failure flag
        // carries errors.
        self.shared.round.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(
        &'a self,
        mut g: MutexGuard<'a, Round>,
        deadline: Instant,
        done: impl Fn(&Round) -> bool,
    ) -> Result<MutexGuard<'a, Round>, CollectiveError> {
        while !done(&g) {
            let now = Instant::now();
            if now >= deadline {
                let err = CollectiveError::Timeout(self.shared.timeout);
                g.failed.get_or_insert(err.clone());
                self.shared.cv.notify_all();
                return Err(err);
            }
            g = self
                .shared
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(g)
    }

    fn run(&self, buf: &mut [f32], op: Op) -> Result<(), CollectiveError> {
        let size = self.shared.size;
        if size == 1 {
            return match op {
                Op::Broadcast(root) if root != 0 => Err(CollectiveError::BadRoot { root, size }),
                _ => Ok(()),
            };
        }
        let deadline = Instant::now() + self.shared.timeout;
        // Wait for the previous round to drain.
        let mut g = self.wait(self.lock(), deadline, |r| !r.draining || r.failed.is_some())?;
        if let Some(e) = &g.failed {
            return Err(CollectiveError::Poisoned(e.to_string()));
        }
        let generation = g.generation;
        let expected = g.acc.as_ref().map(|a| a.len());
        if let Some(expected) = expected.filter(|&n| n != buf.len()) {
            let err = CollectiveError::Length {
                rank: self.rank,
                expected,
                got: buf.len(),
            };
            g.failed = Some(err.clone());
            self.shared.cv.notify_all();
            return Err(err);
        }
        match op {
            Op::Sum => match &mut g.acc {
                Some(acc) => acc.iter_mut().zip(buf.iter()).for_each(|(a, b)| *a += b),
                None => g.acc = Some(buf.to_vec()),
            },
            Op::Broadcast(root) => {
                if root >= size {
                    return Err(CollectiveError::BadRoot { root, size });
                }
                let acc = g.acc.get_or_insert_with(|| vec![0.0; buf.len()]);
                if self.rank == root {
                    acc.copy_from_slice(buf);
                }
            }
        }
        g.arrived += 1;
        if g.arrived == size {
            g.draining = true;
            self.shared.cv.notify_all();
        }
        let mut g = self.wait(g, deadline, |r| {
            (r.draining && r.generation == generation) || r.failed.is_some()
        })?;
        if let Some(e) = &g.failed {
            return Err(CollectiveError::Poisoned(e.to_string()));
        }
        if let Some(acc) = &g.acc {
            buf.copy_from_slice(acc);
        }
        g.departed += 1;
        if g.departed == size {
            g.arrived = 0;
            g.departed = 0;
            g.draining = false;
            g.acc = None;
            g.generation += 1;
            self.shared.cv.notify_all();
        }
        Ok(())
    }
}

impl Collective for HostComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        self.run(buf, Op::Sum)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.run(buf, Op::Broadcast(root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_reduce_and_broadcast_repeatedly() {
        let comms = HostGroup::members(3, Duration::from_secs(10));
        let out: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut seen = Vec::new();
                        for round in 0..5 {
                            let mut b = vec![c.rank() as f32 + round as f32, 1.0];
                            c.all_reduce_sum(&mut b).unwrap();
                            seen.extend(b);
                            let mut b = vec![c.rank() as f32; 2];
                            c.broadcast(&mut b, 2).unwrap();
                            seen.extend(b);
                        }
                        seen
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for seen in &out {
            assert_eq!(seen, &out[0]);
        }
        assert_eq!(out[0][..4], [3.0, 3.0, 2.0, 2.0]);
        assert_eq!(out[0][16..20], [15.0, 3.0, 2.0, 2.0]);
    }

    #[test]
    fn a_missing_member_times_out_and_a_bad_length_fails_everyone() {
        let comms = HostGroup::members(2, Duration::from_millis(50));
        let mut b = vec![1.0];
        assert_eq!(
            comms[0].all_reduce_sum(&mut b),
            Err(CollectiveError::Timeout(Duration::from_millis(50)))
        );
        let comms = HostGroup::members(2, Duration::from_secs(5));
        let r: Vec<_> = std::thread::scope(|s| {
            let a = s.spawn(|| comms[0].all_reduce_sum(&mut [1.0, 2.0]));
            let b = s.spawn(|| comms[1].all_reduce_sum(&mut [1.0]));
            vec![a.join().unwrap(), b.join().unwrap()]
        });
        assert!(r.iter().all(|x| x.is_err()));
        let single = HostGroup::members(1, Duration::from_secs(1));
        assert!(single[0].broadcast(&mut [1.0], 1).is_err());
    }
}

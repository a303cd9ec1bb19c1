//! The core trainer's checkpoint storage in the simulator: a modelled disk
//! that outlives the trainer's crash. Every incarnation of the core's
//! trainer (the first build and each rebuild after its node restarts)
//! shares it, as processes on one machine share its file system. A write
//! lands whole when its modelled I/O completes, so a crash mid-write leaves
//! the checkpoint before (the embedded trainer's rename gives the same).

use std::sync::{Arc, Mutex, MutexGuard};

use gyre_actors::sched::ids::Version;

#[derive(Debug, Clone, Default)]
pub struct CheckpointDisk(Arc<Mutex<Option<Version>>>);

impl CheckpointDisk {
    fn slot(&self) -> MutexGuard<'_, Option<Version>> {
        // The simulator is one thread: a poisoned lock only means a panic
        // elsewhere, and the value is still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The version of the last durable checkpoint, if any.
    pub fn last(&self) -> Option<Version> {
        *self.slot()
    }

    /// Makes the checkpoint of `version` the durable one.
    pub fn write(&self, version: Version) {
        *self.slot() = Some(version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_clone_sees_the_last_write() {
        let disk = CheckpointDisk::default();
        let other = disk.clone();
        assert_eq!(other.last(), None);
        disk.write(3);
        disk.write(6);
        assert_eq!(other.last(), Some(6));
    }
}

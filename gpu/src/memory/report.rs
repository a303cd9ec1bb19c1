//! The accounting report of device memory: what a cell logs on every role
//! change and what the simulator's memory model is checked against.

use std::fmt;

use super::Tag;

/// One tag's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagUsage {
    pub tag: Tag,
    /// Size of the region.
    pub bytes: u64,
    /// On the device now (0 while released).
    pub resident: u64,
    /// Held on the host while released.
    pub host_backup: u64,
    /// Largest resident size seen.
    pub peak: u64,
    /// Times released.
    pub releases: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    pub backend: &'static str,
    pub tags: Vec<TagUsage>,
    /// Resident bytes, all tags.
    pub resident: u64,
    /// Peak resident bytes, all tags together.
    pub peak: u64,
    pub capacity: Option<u64>,
}

impl MemoryReport {
    pub fn usage(&self, tag: Tag) -> Option<&TagUsage> {
        self.tags.iter().find(|u| u.tag == tag)
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<16} {:>12} {:>12} {:>12} {:>12} {:>9}",
            "tag", "bytes", "resident", "host_backup", "peak", "releases"
        )?;
        for u in &self.tags {
            writeln!(
                f,
                "{:<16} {:>12} {:>12} {:>12} {:>12} {:>9}",
                u.tag.name(),
                u.bytes,
                u.resident,
                u.host_backup,
                u.peak,
                u.releases
            )?;
        }
        write!(
            f,
            "{} backend: {} bytes resident, peak {}",
            self.backend, self.resident, self.peak
        )?;
        if let Some(c) = self.capacity {
            write!(f, ", capacity {c}")?;
        }
        Ok(())
    }
}

//! Deliberate violations of actors/clippy.toml (see Cargo.toml).

pub fn wall_clock() -> u128 {
    std::time::Instant::now().elapsed().as_nanos()
}

pub fn system_clock() -> bool {
    std::time::SystemTime::now() > std::time::UNIX_EPOCH
}

pub fn thread() {
    let _ = std::thread::spawn(|| ()).join();
}

pub fn random_hasher() -> usize {
    let m: std::collections::HashMap<u8, u8> = std::collections::HashMap::new();
    let s: std::collections::HashSet<u8> = std::collections::HashSet::new();
    m.len() + s.len()
}

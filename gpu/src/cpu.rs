//! Process-wide settings of the CPU tensor kernels, applied once at
//! start-up by the programs that run the embedded model (the `gyre`
//! binary, the policy bench, the PyTorch comparison).
//!
//! candle asks for its thread count on every matrix product, and unless
//! `RAYON_NUM_THREADS` is set it works that count out again each time,
//! which on Linux without a CPU mask means parsing `/proc/cpuinfo`: a
//! quarter of a training step's time on the default model went to the
//! kernel formatting that file. [`settle`] pins the count candle would
//! compute to the environment, so the matrix products run on exactly the
//! threads they ran on before without the lookup.
//!
//! candle also runs large elementwise maps on a second pool of its own
//! (`CANDLE_NUM_THREADS`, one thread per core by default) beside rayon's
//! (one per core, the matrix products'), and both spin after each task:
//! on a few cores the two pools take turns starving each other, and a
//! training step waited on that more than it computed (the default
//! model's step went from about 2.9 s to 0.25 s on two cores). [`settle`]
//! keeps elementwise maps on the calling thread. Both settings leave
//! every result the same to the bit: an elementwise map computes each
//! element the same way on any thread, and the products keep their
//! thread count.
//!
//! Every tensor op allocates its output afresh, and a training step makes
//! hundreds of buffers of a few hundred KiB to a few MiB. glibc serves
//! those above its mmap threshold with fresh mappings and returns freed
//! heap tops to the kernel, so each step paid for page faults and the
//! kernel zeroing pages it had just taken back (about 7% of the default
//! model's step in `perf`). [`settle`] fixes the threshold at glibc's
//! largest (32 MiB) and keeps freed memory for reuse (the trim
//! threshold): 15–20% less time per training step on two cores (see the
//! README's PyTorch comparison). The price is that the process keeps its
//! peak heap, as PyTorch's caching allocator does.
//!
//! Two helpers the kernels share live here too: [`on_pool`], which runs
//! a pass on rayon's threads, and `simd_dispatch!`, which picks a loop's
//! AVX2 build where the CPU has it.

/// Fixes the CPU kernels' threads for the rest of the process (see the
/// module comment); `RAYON_NUM_THREADS` or `CANDLE_NUM_THREADS` already
/// set are kept.
///
/// Call it first thing in `main`, before any thread starts: it writes the
/// process environment, which is only sound while no other thread reads
/// it.
pub fn settle() {
    let set = |name: &str, value: String| {
        if std::env::var_os(name).is_none() {
            // SAFETY: documented precondition: called before other threads
            // exist, so nothing reads the environment concurrently.
            unsafe { std::env::set_var(name, value) };
        }
    };
    set(
        "RAYON_NUM_THREADS",
        candle_core::utils::get_num_threads().to_string(),
    );
    set("CANDLE_NUM_THREADS", "1".to_string());
    keep_freed_memory();
}

/// Runs `f` on one of rayon's threads (in place when already on one) and
/// waits for it. A pass whose products and row loops are each split over
/// rayon's pool pays, when it runs on a thread outside the pool, for
/// handing every one of them to the pool and sleeping until it is done;
/// from inside the pool each split is a join that the other threads
/// steal from. On two cores that handing over was a tenth of a decode
/// step's time.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// Calls the AVX2 and FMA build of a loop where the CPU has them (the
/// crate builds for baseline x86-64), else the baseline one. Neither
/// contracts a multiply and an add, so both give the same bits.
macro_rules! simd_dispatch {
    ($loops:ident, $avx2:ident, ($($arg:ident : $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        fn $avx2($($arg: $ty),*) {
            $loops($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has both features, checked just above.
            return unsafe { $avx2($($arg),*) };
        }
        return $loops($($arg),*);
    };
}
pub(crate) use simd_dispatch;

/// glibc's largest mmap threshold; larger values are refused.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;
/// Freed memory at the heap's top is given back only above this.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 1 << 30;

/// See the module comment. Settings the C library refuses (or another
/// allocator) leave allocation as it was: nothing depends on them but
/// speed.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called
    // before other threads exist (see `settle`).
    unsafe {
        let mmap = libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        let trim = libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        if mmap == 0 || trim == 0 {
            tracing::debug!(mmap, trim, "the C library refused an allocator setting");
        }
    }
}

//! Giving freed heap back to the system once many Pods are gone.
//!
//! musl's allocator, in the shipped static build, unmaps freed pages by
//! itself. glibc's keeps them in its per-thread arenas until asked with
//! `malloc_trim`: a glibc build (`make build`) that had held 2000 Pods kept
//! 20 MiB of arenas for 9 MiB in use after they were deleted (measured
//! with `malloc_stats`). [`Trim`] asks when the node has shed many Pods;
//! elsewhere it does nothing.

/// Pods gone, counted from the most the cache held since the last trim,
/// before a trim: one per burst of deletions, not one per Pod.
pub const STEP: usize = 100;

/// When to give memory back, from the number of Pods cached (pure; the
/// release itself is [`release`]).
#[derive(Debug, Default)]
pub struct Trim {
    peak: usize,
}

impl Trim {
    /// Notes that `pods` are cached now; true (time to [`release`]) when
    /// at least [`STEP`] fewer than the peak since the last trim.
    pub fn observe(&mut self, pods: usize) -> bool {
        if pods >= self.peak {
            self.peak = pods;
            return false;
        }
        if self.peak - pods < STEP {
            return false;
        }
        self.peak = pods;
        true
    }
}

/// Returns the allocator's free pages to the system (glibc only).
pub fn release() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks
    // and takes no pointer; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_per_step_below_the_peak() {
        let mut t = Trim::default();
        assert!(!t.observe(0));
        assert!(!t.observe(2000), "growing never trims");
        assert!(!t.observe(2000 - STEP + 1), "fewer than a step gone");
        assert!(t.observe(2000 - STEP), "a step gone");
        assert!(!t.observe(2000 - STEP - 1), "counted again from there");
        assert!(t.observe(0), "the rest gone");
        assert!(!t.observe(0));
        assert!(!t.observe(50));
        assert!(!t.observe(0), "a small burst is not worth a trim");
        assert!(!t.observe(STEP));
        assert!(t.observe(0));
    }
}

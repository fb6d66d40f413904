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

/// Returns the allocator's free pages to the system (glibc only), on a
/// blocking-pool thread: `malloc_trim` walks every arena under its locks
/// and can take tens of milliseconds on a large heap, which would stall
/// every task of a runtime worker (two of them in production). Outside a
/// runtime it runs on the calling thread.
pub fn release() {
    let _ = release_with(trim_heap);
}

/// [`release`] with the trim given (tests observe where it runs).
fn release_with(trim: fn()) -> Option<tokio::task::JoinHandle<()>> {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => Some(rt.spawn_blocking(trim)),
        Err(_) => {
            trim();
            None
        }
    }
}

fn trim_heap() {
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

    thread_local! {
        static TRIMMED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    fn note_thread() {
        TRIMMED_HERE.with(|t| t.set(true));
    }

    /// The trim runs off the runtime's worker thread (a current-thread
    /// runtime: its one worker is the test's thread).
    #[tokio::test(flavor = "current_thread")]
    async fn the_trim_runs_off_the_runtime_workers() {
        let handle = release_with(note_thread);
        if let Some(h) = handle {
            h.await.expect("the trim task");
        }
        assert!(
            !TRIMMED_HERE.with(|t| t.get()),
            "malloc_trim ran on the runtime's worker thread"
        );
        // Outside a runtime it runs where it is called.
        std::thread::spawn(|| {
            assert!(release_with(note_thread).is_none());
            assert!(TRIMMED_HERE.with(|t| t.get()));
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn release_without_a_runtime_does_not_panic() {
        release();
    }
}

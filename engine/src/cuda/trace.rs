//! Timelines of launches from the kernels' own timer stamps: what the traced build of each kernel
//! (`kernel_dsl::emit::trace`) writes, and what it says about a captured step.
//!
//! A [`Gpu`] opened with `FLASHNEXT_TRACE=1` compiles every kernel traced and hands each launch,
//! in the order they are enqueued or captured, four words of one arena ([`Arena`]); a graph keeps
//! its launches' words, so each replay stamps the same ones. [`Gpu::trace_reset`] readies the
//! words, [`Gpu::trace_read`] reads the launches that ran since, and [`Timeline`] splits the span
//! of a chain of launches into what each launch added to it: the hand-off from its predecessor's
//! end to its own wait's return, and its work after the wait.

use std::sync::Mutex;

use super::buffer::DeviceBuffer;
use super::device::Gpu;
use crate::error::{Error, Result};

/// Launches one arena holds: several captures of the 536-launch step and their warm-ups.
pub const CAPACITY: usize = 1 << 16;

/// Words a launch takes: first start, last start, first wait return, last end.
const WORDS: usize = 4;

/// The traced launches' words on the device, and the kernel each slot went to.
#[derive(Debug)]
pub struct Arena {
    words: Mutex<DeviceBuffer<u64>>,
    kernels: Mutex<Vec<String>>,
}

/// One launch's stamps, in ns of the device's global timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchStamps {
    /// The slot: the launch's place in the order launches were enqueued or captured.
    pub slot: usize,
    pub kernel: String,
    pub first_start: u64,
    pub last_start: u64,
    /// The first return from `grid_dependency_wait()`; `None` for a kernel that does not wait.
    pub first_wait: Option<u64>,
    pub last_end: u64,
}

/// Words as the kernels expect them before a launch: the minima at `u64::MAX`, the maxima at 0.
fn ready_words(slots: usize) -> Vec<u64> {
    (0..slots * WORDS).map(|i| if i % 2 == 0 { u64::MAX } else { 0 }).collect()
}

impl Arena {
    pub(crate) fn new(gpu: &Gpu) -> Result<Arena> {
        let words = gpu.upload(&ready_words(CAPACITY))?;
        Ok(Arena { words: Mutex::new(words), kernels: Mutex::new(Vec::new()) })
    }

    /// The device address of the next free slot, now `kernel`'s.
    pub(crate) fn take(&self, kernel: &str) -> Result<u64> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        let slot = kernels.len();
        if slot == CAPACITY {
            return Err(Error::Buffer(format!(
                "the trace arena is full ({CAPACITY} launches): trace fewer launches a process"
            )));
        }
        kernels.push(kernel.to_string());
        let words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        Ok(words.ptr().addr() + (slot * WORDS * 8) as u64)
    }

    pub(crate) fn reset(&self, gpu: &Gpu) -> Result<()> {
        let mut words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        gpu.write(&mut words, &ready_words(CAPACITY))
    }

    /// The launches stamped since the last reset, in slot order.
    pub(crate) fn read(&self, gpu: &Gpu) -> Result<Vec<LaunchStamps>> {
        gpu.synchronize()?;
        let words = gpu.download(&self.words.lock().unwrap_or_else(|e| e.into_inner()))?;
        let kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        Ok(kernels
            .iter()
            .enumerate()
            .filter_map(|(slot, kernel)| {
                let w = &words[slot * WORDS..(slot + 1) * WORDS];
                // A launch that did not run since the reset keeps its start at u64::MAX.
                (w[0] != u64::MAX).then(|| LaunchStamps {
                    slot,
                    kernel: kernel.clone(),
                    first_start: w[0],
                    last_start: w[1],
                    first_wait: (w[2] != u64::MAX).then_some(w[2]),
                    last_end: w[3],
                })
            })
            .collect())
    }
}

/// What one launch added to a chain's span.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub kernel: String,
    /// Its end minus its predecessor's end (the first launch: its own duration), ns: these add
    /// up to the span.
    pub advance: f64,
    /// Its first wait's return minus its predecessor's end, ns: the hand-off (negative if the
    /// wait returned before the predecessor's last block ended; `None` without a wait).
    pub handoff: Option<f64>,
    /// Its end minus its first wait's return (or its first start), ns.
    pub after_wait: f64,
    /// Its predecessor's end minus its own first start, ns: how far ahead it was resident
    /// (negative if it started after).
    pub lead: f64,
}

/// The launches of one replay as a chain, each after the one before.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub steps: Vec<Step>,
    /// The last end minus the first start, ns.
    pub span: f64,
}

/// A kernel's share of a timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelShare {
    pub kernel: String,
    pub launches: usize,
    /// Σ advance, ns.
    pub advance: f64,
    /// Σ hand-off over the launches that wait, ns, and how many those are.
    pub handoff: f64,
    pub waits: usize,
    /// Σ after_wait, ns.
    pub after_wait: f64,
}

impl Timeline {
    /// The chain of `launches` (in slot order, as [`Gpu::trace_read`] gives them).
    pub fn of(launches: &[LaunchStamps]) -> Timeline {
        let mut steps = Vec::with_capacity(launches.len());
        for (i, l) in launches.iter().enumerate() {
            let end = l.last_end as f64;
            let from = l.first_wait.unwrap_or(l.first_start) as f64;
            let (advance, handoff, lead) = match i.checked_sub(1).map(|p| launches[p].last_end as f64) {
                Some(prev_end) => {
                    (end - prev_end, l.first_wait.map(|w| w as f64 - prev_end), prev_end - l.first_start as f64)
                }
                None => (end - l.first_start as f64, None, 0.0),
            };
            steps.push(Step { kernel: l.kernel.clone(), advance, handoff, after_wait: end - from, lead });
        }
        let span = match (launches.first(), launches.last()) {
            (Some(a), Some(b)) => b.last_end as f64 - a.first_start as f64,
            _ => 0.0,
        };
        Timeline { steps, span }
    }

    /// The steps summed by kernel, the largest advance first.
    pub fn by_kernel(&self) -> Vec<KernelShare> {
        let mut shares: Vec<KernelShare> = Vec::new();
        for s in &self.steps {
            let i = match shares.iter().position(|k| k.kernel == s.kernel) {
                Some(i) => i,
                None => {
                    shares.push(KernelShare {
                        kernel: s.kernel.clone(),
                        launches: 0,
                        advance: 0.0,
                        handoff: 0.0,
                        waits: 0,
                        after_wait: 0.0,
                    });
                    shares.len() - 1
                }
            };
            let k = &mut shares[i];
            k.launches += 1;
            k.advance += s.advance;
            k.after_wait += s.after_wait;
            if let Some(h) = s.handoff {
                k.handoff += h;
                k.waits += 1;
            }
        }
        shares.sort_by(|a, b| b.advance.total_cmp(&a.advance));
        shares
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(slot: usize, kernel: &str, start: u64, wait: Option<u64>, end: u64) -> LaunchStamps {
        LaunchStamps {
            slot,
            kernel: kernel.into(),
            first_start: start,
            last_start: start,
            first_wait: wait,
            last_end: end,
        }
    }

    #[test]
    fn advances_add_up_to_the_span_and_split_into_handoff_and_work() {
        // a: 100..400; b resident from 300, waits until 450, ends 900; c never waits, 950..1000.
        let l = [stamps(0, "a", 100, None, 400), stamps(1, "b", 300, Some(450), 900), stamps(2, "c", 950, None, 1000)];
        let t = Timeline::of(&l);
        assert_eq!(t.span, 900.0);
        assert_eq!(t.steps.iter().map(|s| s.advance).sum::<f64>(), t.span);
        assert_eq!(t.steps[1].advance, 500.0);
        assert_eq!(t.steps[1].handoff, Some(50.0));
        assert_eq!(t.steps[1].after_wait, 450.0);
        assert_eq!(t.steps[1].lead, 100.0);
        assert_eq!(t.steps[2].handoff, None);
        assert_eq!(t.steps[2].lead, -50.0);
        assert_eq!(t.steps[2].after_wait, 50.0);
    }

    #[test]
    fn shares_sum_by_kernel_largest_first() {
        let l = [
            stamps(0, "a", 0, None, 10),
            stamps(1, "b", 5, Some(12), 40),
            stamps(2, "a", 35, Some(41), 50),
            stamps(3, "b", 45, Some(52), 90),
        ];
        let shares = Timeline::of(&l).by_kernel();
        assert_eq!(shares.iter().map(|s| s.kernel.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!((shares[0].launches, shares[0].advance, shares[0].waits, shares[0].handoff), (2, 70.0, 2, 4.0));
        assert_eq!((shares[1].launches, shares[1].advance, shares[1].waits, shares[1].handoff), (2, 20.0, 1, 1.0));
        assert_eq!(shares.iter().map(|s| s.advance).sum::<f64>(), 90.0);
    }

    #[test]
    fn ready_words_put_minima_high_and_maxima_low() {
        assert_eq!(ready_words(2), [u64::MAX, 0, u64::MAX, 0, u64::MAX, 0, u64::MAX, 0]);
    }
}

//! Timelines of launches from the kernels' own timer stamps: what the traced build of each kernel
//! (`kernel_dsl::emit::trace`) writes, and what it says about a captured step.
//!
//! A [`Gpu`] opened with `FLASHNEXT_TRACE=1` compiles every kernel traced and hands each launch,
//! in the order they are enqueued or captured, four words of one arena and a record for each of
//! its blocks ([`Arena`]); a graph keeps its launches' words, so each replay stamps the same ones.
//! [`Gpu::trace_reset`] readies the words, [`Gpu::trace_read`] reads the launches that ran since,
//! and [`Timeline`] splits the span of a chain of launches into what each launch added to it: the
//! hand-off from its predecessor's end to its own wait's return, and its work after the wait.
//! [`LaunchStamps::critical`] says which block ended a launch, and whether it started late or ran
//! long.

use std::sync::Mutex;

use super::buffer::DeviceBuffer;
use super::device::Gpu;
use crate::error::{Error, Result};

/// Launches one arena holds: several captures of the 536-launch step and their warm-ups.
pub const CAPACITY: usize = 1 << 16;

/// Block records one arena holds (32 bytes each, 128 MiB): the step's replay takes about
/// 160 thousand, so about 25 captures or eager steps.
pub const BLOCK_CAPACITY: usize = 1 << 22;

/// Launches of more blocks than this record none (the fills that make a synthetic model's weights
/// run millions); the step's largest grid is about two thousand.
pub const MOST_BLOCKS_RECORDED: usize = 1 << 16;

/// Words a launch takes: first start, last start, first wait return, last end.
const WORDS: usize = 4;

/// Words a block's record takes: start, wait return, end, SM.
const BLOCK_WORDS: usize = 4;

/// A traced launch: its kernel and where its block records begin.
#[derive(Debug)]
struct Slot {
    kernel: String,
    first_block: usize,
    blocks: usize,
}

/// The traced launches' words and block records on the device, and the kernel each slot went to.
#[derive(Debug)]
pub struct Arena {
    words: Mutex<DeviceBuffer<u64>>,
    blocks: DeviceBuffer<u64>,
    slots: Mutex<Vec<Slot>>,
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
    /// Each block's own stamps, in the order of its linear index (none for a grid of more than
    /// [`MOST_BLOCKS_RECORDED`] blocks).
    pub blocks: Vec<BlockStamps>,
}

/// One block's stamps, in ns of the device's global timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockStamps {
    /// The SM it ran on.
    pub sm: u32,
    pub start: u64,
    /// Its return from `grid_dependency_wait()`; `None` if its thread 0 did not wait.
    pub wait: Option<u64>,
    pub end: u64,
}

impl BlockStamps {
    /// Its end minus its wait's return (or its start, if it did not wait), ns.
    pub fn run(&self) -> f64 {
        self.end as f64 - self.wait.unwrap_or(self.start) as f64
    }
}

/// The block that ended a launch, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Critical {
    /// Its linear index and SM.
    pub block: usize,
    pub sm: u32,
    /// Its start minus the launch's first start, ns: how late it was let in.
    pub late: f64,
    /// Its end minus its wait's return (or its start), ns: how long it ran after.
    pub run: f64,
}

impl LaunchStamps {
    /// The block whose end was the launch's end (the lower index on a tie); `None` without
    /// block records.
    pub fn critical(&self) -> Option<Critical> {
        let (block, b) = self.blocks.iter().enumerate().max_by(|a, b| a.1.end.cmp(&b.1.end).then(b.0.cmp(&a.0)))?;
        Some(Critical { block, sm: b.sm, late: b.start as f64 - self.first_start as f64, run: b.run() })
    }

    /// The median over the blocks of end minus wait return (or start), ns.
    pub fn median_run(&self) -> Option<f64> {
        let mut runs: Vec<f64> = self.blocks.iter().map(BlockStamps::run).collect();
        if runs.is_empty() {
            return None;
        }
        runs.sort_by(f64::total_cmp);
        Some(runs[runs.len() / 2])
    }

    /// The most blocks of this launch that ran on one SM.
    pub fn most_blocks_an_sm(&self) -> usize {
        let mut per_sm = std::collections::BTreeMap::new();
        for b in &self.blocks {
            *per_sm.entry(b.sm).or_insert(0usize) += 1;
        }
        per_sm.values().copied().max().unwrap_or(0)
    }
}

/// Words as the kernels expect them before a launch: the minima at `u64::MAX`, the maxima at 0.
fn ready_words(slots: usize) -> Vec<u64> {
    (0..slots * WORDS).map(|i| if i % 2 == 0 { u64::MAX } else { 0 }).collect()
}

/// A block's record as the device left it.
fn block_stamps(record: &[u64]) -> BlockStamps {
    BlockStamps { sm: record[3] as u32, start: record[0], wait: (record[1] != 0).then_some(record[1]), end: record[2] }
}

impl Arena {
    pub(crate) fn new(gpu: &Gpu) -> Result<Arena> {
        let words = gpu.upload(&ready_words(CAPACITY))?;
        // Zeroed: a record's wait word stays 0 for a block that does not wait.
        let blocks = gpu.alloc(BLOCK_CAPACITY * BLOCK_WORDS)?;
        Ok(Arena { words: Mutex::new(words), blocks, slots: Mutex::new(Vec::new()) })
    }

    /// The device addresses of the next free slot's words and of its `blocks` records (null
    /// past [`MOST_BLOCKS_RECORDED`]: the kernel records none), now `kernel`'s.
    pub(crate) fn take(&self, kernel: &str, blocks: usize) -> Result<(u64, u64)> {
        let blocks = if blocks > MOST_BLOCKS_RECORDED { 0 } else { blocks };
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.len();
        let first_block = slots.last().map_or(0, |s| s.first_block + s.blocks);
        if slot == CAPACITY || first_block + blocks > BLOCK_CAPACITY {
            return Err(Error::Buffer(format!(
                "the trace arena is full ({slot} launches, {first_block} blocks; it holds {CAPACITY} and \
                 {BLOCK_CAPACITY}): trace fewer launches a process"
            )));
        }
        slots.push(Slot { kernel: kernel.to_string(), first_block, blocks });
        let words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        let records = match blocks {
            0 => 0,
            _ => self.blocks.ptr().addr() + (first_block * BLOCK_WORDS * 8) as u64,
        };
        Ok((words.ptr().addr() + (slot * WORDS * 8) as u64, records))
    }

    /// Forgets every launch taken so far: the next one takes the first slot again.
    pub(crate) fn forget(&self) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Readies the launches' words; the block records are each overwritten by their block.
    pub(crate) fn reset(&self, gpu: &Gpu) -> Result<()> {
        let mut words = self.words.lock().unwrap_or_else(|e| e.into_inner());
        gpu.write(&mut words, &ready_words(CAPACITY))
    }

    /// The launches stamped since the last reset, in slot order, with their blocks.
    pub(crate) fn read(&self, gpu: &Gpu) -> Result<Vec<LaunchStamps>> {
        gpu.synchronize()?;
        let words = gpu.download(&self.words.lock().unwrap_or_else(|e| e.into_inner()))?;
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        // Only the records handed out so far (the step's replay: about 5 MB of the 128 MiB).
        let used = slots.last().map_or(0, |s| s.first_block + s.blocks);
        let records = gpu.download_first(&self.blocks, used * BLOCK_WORDS)?;
        Ok(slots
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                let w = &words[slot * WORDS..(slot + 1) * WORDS];
                let records = &records[s.first_block * BLOCK_WORDS..(s.first_block + s.blocks) * BLOCK_WORDS];
                // A launch that did not run since the reset keeps its start at u64::MAX.
                (w[0] != u64::MAX).then(|| LaunchStamps {
                    slot,
                    kernel: s.kernel.clone(),
                    first_start: w[0],
                    last_start: w[1],
                    first_wait: (w[2] != u64::MAX).then_some(w[2]),
                    last_end: w[3],
                    blocks: records.chunks_exact(BLOCK_WORDS).map(block_stamps).collect(),
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
            blocks: Vec::new(),
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
    fn the_critical_block_is_the_last_to_end_and_says_whether_it_was_late_or_long() {
        let block = |sm, start, wait, end| BlockStamps { sm, start, wait, end };
        let mut l = stamps(0, "a", 100, Some(150), 900);
        l.blocks = vec![
            block(3, 100, Some(150), 500),
            block(7, 400, Some(420), 900),
            block(3, 120, None, 300),
            block(5, 110, Some(150), 900),
        ];
        // Blocks 1 and 3 both end at 900: the lower index is the critical one.
        let c = l.critical().expect("blocks");
        assert_eq!((c.block, c.sm, c.late, c.run), (1, 7, 300.0, 480.0));
        // Runs: 350, 480, 180 (no wait: from its start), 750.
        assert_eq!(l.median_run(), Some(480.0));
        assert_eq!(l.most_blocks_an_sm(), 2);
        assert_eq!(stamps(0, "b", 0, None, 1).critical(), None);
    }

    #[test]
    fn a_record_with_a_zero_wait_word_did_not_wait() {
        assert_eq!(block_stamps(&[10, 0, 20, 4]), BlockStamps { sm: 4, start: 10, wait: None, end: 20 });
        assert_eq!(block_stamps(&[10, 15, 20, 131]), BlockStamps { sm: 131, start: 10, wait: Some(15), end: 20 });
    }

    #[test]
    fn ready_words_put_minima_high_and_maxima_low() {
        assert_eq!(ready_words(2), [u64::MAX, 0, u64::MAX, 0, u64::MAX, 0, u64::MAX, 0]);
    }
}

//! Timing device work with CUDA events on the engine's stream.

use std::time::Duration;

use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use super::device::Gpu;
use crate::error::{DriverContext, Result};

/// A pair of timing events around work enqueued on the GPU's stream.
#[derive(Debug)]
pub struct EventTimer {
    start: CudaEvent,
    end: CudaEvent,
}

impl EventTimer {
    pub fn new(gpu: &Gpu) -> Result<EventTimer> {
        let ctx = gpu.context();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).during("creating a timing event")?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).during("creating a timing event")?;
        Ok(EventTimer { start, end })
    }

    pub fn start(&self, gpu: &Gpu) -> Result<()> {
        self.start.record(gpu.stream()).during("recording an event")
    }

    /// Records the end and waits for it: the device time between the two records.
    pub fn stop(&self, gpu: &Gpu) -> Result<Duration> {
        self.end.record(gpu.stream()).during("recording an event")?;
        let ms = self.start.elapsed_ms(&self.end).during("reading an event timer")?;
        Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
    }
}

/// Times `f` over `reps` runs between one pair of events (the launches pipeline as they would in
/// a stream), after `warmup` untimed runs: the mean device time of one run.
pub fn time_mean(gpu: &Gpu, warmup: usize, reps: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<Duration> {
    for i in 0..warmup {
        f(i)?;
    }
    let t = EventTimer::new(gpu)?;
    t.start(gpu)?;
    for i in 0..reps {
        f(i)?;
    }
    let total = t.stop(gpu)?;
    Ok(total / reps.max(1) as u32)
}

/// The device's copy bandwidth in bytes per second, counting bytes read plus bytes written, from
/// device-to-device copies of `bytes` (use ≥ 1 GiB: far beyond the L2).
pub fn copy_bandwidth(gpu: &Gpu, bytes: usize) -> Result<f64> {
    let src = gpu.alloc::<u8>(bytes)?;
    let mut dst = gpu.alloc::<u8>(bytes)?;
    let t = time_mean(gpu, 2, 10, |_| gpu.copy(&src, &mut dst))?;
    Ok(2.0 * bytes as f64 / t.as_secs_f64())
}

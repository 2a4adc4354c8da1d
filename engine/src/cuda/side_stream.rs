//! A second stream forked from the GPU's stream and joined back with events: work that depends
//! only on what the main stream did before the fork runs beside what it does after. Event
//! record and wait across two streams is what a CUDA graph capture turns into parallel
//! branches, so a forked step stays one graph.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};

use super::device::Gpu;
use crate::error::{DriverContext, Result};

/// A side stream with its fork and join events.
#[derive(Debug)]
pub struct SideStream {
    stream: Arc<CudaStream>,
    forked: CudaEvent,
    joined: CudaEvent,
}

impl SideStream {
    pub fn new(gpu: &Gpu) -> Result<SideStream> {
        let ctx = gpu.context();
        let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).during("creating a fork event");
        Ok(SideStream {
            stream: ctx.new_stream().during("creating a side stream")?,
            forked: event()?,
            joined: event()?,
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// What is enqueued on the side stream from now on runs after everything enqueued on the
    /// main stream so far.
    pub fn fork(&self, gpu: &Gpu) -> Result<()> {
        self.forked.record(gpu.stream()).during("recording the fork")?;
        self.stream.wait(&self.forked).during("waiting on the fork")
    }

    /// What is enqueued on the main stream from now on runs after everything enqueued on the
    /// side stream so far.
    pub fn join(&self, gpu: &Gpu) -> Result<()> {
        self.joined.record(&self.stream).during("recording the join")?;
        gpu.stream().wait(&self.joined).during("waiting on the join")
    }
}

//! CUDA graphs: a sequence of launches recorded once and replayed with one call.
//!
//! Capture needs what the engine already guarantees: one non-default stream, no event tracking,
//! every buffer allocated and every kernel loaded before capture (nothing allocated inside it).

use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::device::Gpu;
use crate::error::{DriverContext, Error, Result};

/// A captured, instantiated graph, replayed on the stream it was captured from.
pub struct Graph {
    graph: CudaGraph,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("exec", &self.graph.cu_graph_exec()).finish()
    }
}

impl Graph {
    /// Enqueues one replay.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch().during("launching a graph")
    }
}

impl Gpu {
    /// Records what `record` enqueues on the stream into a graph; nothing runs during capture. The
    /// capture is ended even when `record` fails, so the stream is usable again afterwards.
    pub fn capture(&self, record: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let stream = self.stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .during("beginning a graph capture")?;
        let recorded = record();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0)).during("ending a graph capture");
        recorded?;
        let graph = ended?.ok_or_else(|| Error::Buffer("the graph capture recorded nothing".into()))?;
        graph.upload().during("uploading a graph")?;
        Ok(Graph { graph })
    }
}

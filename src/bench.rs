//! Timing for the benches: CUDA events around replays of a captured graph, summarised as the
//! median and the 10th and 90th percentiles (seconds).

use engine::cuda::timing::EventTimer;
use engine::cuda::{Gpu, Graph};

/// The value at fraction `p` of an ascending slice (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// (median, p10, p90) of `samples` timed replays of `g`, after one untimed warm-up replay.
pub fn replay_times(gpu: &Gpu, g: &Graph, samples: usize) -> (f64, f64, f64) {
    replay_times_with(gpu, g, samples, 1, || {})
}

/// As [`replay_times`], each replay's time divided by `per_replay` (the steps or launches the
/// graph chains), with `before` run ahead of every replay, outside the timed span (to rewrite the
/// inputs, say).
pub fn replay_times_with(
    gpu: &Gpu,
    g: &Graph,
    samples: usize,
    per_replay: usize,
    mut before: impl FnMut(),
) -> (f64, f64, f64) {
    let t = EventTimer::new(gpu).expect("events");
    before();
    g.launch().expect("warm-up replay");
    let mut v: Vec<f64> = (0..samples)
        .map(|_| {
            before();
            t.start(gpu).expect("start");
            g.launch().expect("replay");
            t.stop(gpu).expect("stop").as_secs_f64() / per_replay as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (percentile(&v, 0.5), percentile(&v, 0.1), percentile(&v, 0.9))
}

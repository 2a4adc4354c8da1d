//! Timing for the benches: CUDA events around replays of a captured graph, summarised as the
//! median and the 10th and 90th percentiles (seconds); and the one record schema every bench writes
//! ([`Record`], through a [`Recorder`]), which `bench-report` renders into BENCHMARKS.md.

use std::io::Write;
use std::time::Duration;

use engine::cuda::timing::EventTimer;
use engine::cuda::{Gpu, Graph, LoadedKernel};
use kernel_dsl::KernelDef;
use serde::{Deserialize, Serialize};

/// GPU 0 for the bench `name`, or None after a line saying why the bench is skipped (no device,
/// no driver): every bench starts here, so that each runs anywhere and says what it skipped.
pub fn open_gpu(name: &str) -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("{name} bench skipped: {e}");
            None
        }
    }
}

/// [`open_gpu`], then the device's copy bandwidth (1 GiB device-to-device copies, read + write
/// counted), which the records compare each figure with; prints the device line.
pub fn open_gpu_with_copy_bandwidth(name: &str) -> Option<(Gpu, f64)> {
    let gpu = open_gpu(name)?;
    let copy_bw = engine::cuda::timing::copy_bandwidth(&gpu, 1 << 30).expect("copy bandwidth");
    let info = gpu.info();
    println!(
        "device {} ({} SMs, {} MB L2): device-to-device copy {:.2} TB/s (read + write)",
        info.name,
        info.sm_count,
        info.l2_bytes >> 20,
        copy_bw / 1e12
    );
    Some((gpu, copy_bw))
}

/// A count from the environment variable `name`, or `default` when it is unset; a value that is
/// not a count stops the bench, naming the variable.
pub fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number")),
        Err(_) => default,
    }
}

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

/// The device time of `replays` replays of `g`, each between its own pair of events with `before`
/// run ahead of it outside the timed span: for criterion's `iter_custom`, where the inputs must
/// change between replays as they do in [`replay_times_with`].
pub fn replays_duration_with(gpu: &Gpu, g: &Graph, replays: usize, mut before: impl FnMut()) -> Duration {
    let t = EventTimer::new(gpu).expect("events");
    (0..replays)
        .map(|_| {
            before();
            t.start(gpu).expect("start");
            g.launch().expect("replay");
            t.stop(gpu).expect("stop")
        })
        .sum()
}

/// The H200's read bandwidth as GPU.md measured it: the reference every issue's target is a
/// fraction of.
pub const H200_REFERENCE_BYTES_PER_S: f64 = 4.27e12;

/// The GB10's streaming rate, for the projections (no GB10 is available to measure).
pub const GB10_STREAMING_BYTES_PER_S: f64 = 230e9;

/// What one record's time is for: a bench times a graph of many launches and divides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    #[serde(rename = "per layer")]
    Layer,
    #[serde(rename = "per site")]
    Site,
    #[serde(rename = "per token")]
    Token,
    #[serde(rename = "per launch")]
    Launch,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Layer => "per layer",
            Unit::Site => "per site",
            Unit::Token => "per token",
            Unit::Launch => "per launch",
        }
    }
}

/// One measurement, in the one schema every bench writes to `$OUT/bench-<bench>.jsonl` (one JSON
/// object a line) and `bench-report` renders into BENCHMARKS.md. Times are µs for one `unit`;
/// floors and fractions are derived from `bytes` when the bench knows what the unit must move.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The bench (the `benches/<bench>.rs` file, or its PyTorch counterpart).
    pub bench: String,
    /// What is timed: "layer", "kernel", "sweep gate_up", "torch", ...
    pub group: String,
    /// The variant within the group: a format, a shape, a tile set, a context.
    pub case: String,
    pub device: String,
    /// The architecture the kernels were compiled for (`sm_90`).
    pub arch: String,
    /// When the record was written, UTC, `YYYY-MM-DDTHH:MMZ`.
    pub date: String,
    pub unit: Unit,
    pub median_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p10_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90_us: Option<f64>,
    /// The bytes one unit must move (none where bytes are not what bounds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The device-to-device copy bandwidth measured in the same run, GB/s (read + write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_gb_s: Option<f64>,
    /// `bytes` at the measured copy bandwidth, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_copy_us: Option<f64>,
    /// `bytes` at 4.27 TB/s, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_ref_us: Option<f64>,
    /// `floor_ref_us / median_us`: the fraction of 4.27 TB/s reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Kernel launches per unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launches: Option<u32>,
    /// Anything else worth keeping: tiles, the table's residency, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
}

impl Record {
    /// GB/s at the median, where the bytes are known.
    pub fn gb_per_s(&self) -> Option<f64> {
        self.bytes.map(|b| b as f64 / self.median_us / 1e3)
    }

    /// The bytes at the GB10's 230 GB/s, µs (a projection).
    pub fn gb10_floor_us(&self) -> Option<f64> {
        self.bytes.map(|b| b as f64 / GB10_STREAMING_BYTES_PER_S * 1e6)
    }

    /// The human-readable line the benches print.
    pub fn line(&self) -> String {
        let mut s =
            format!("{} {} {}: {:.2} us {}", self.bench, self.group, self.case, self.median_us, self.unit.as_str());
        if let (Some(a), Some(b)) = (self.p10_us, self.p90_us) {
            s += &format!(" (p10 {a:.2}, p90 {b:.2})");
        }
        if let Some(n) = self.launches {
            s += &format!(", {n} launch{}", if n == 1 { "" } else { "es" });
        }
        if let (Some(b), Some(r)) = (self.bytes, self.gb_per_s()) {
            s += &format!(", {:.2} MB, {r:.0} GB/s", b as f64 / 1e6);
            if let Some(f) = self.fraction {
                s += &format!(", {:.1}% of 4.27 TB/s", 100.0 * f);
            }
            if let Some(c) = self.copy_gb_s {
                s += &format!(", {:.1}% of measured copy BW", 100.0 * r / c);
            }
            if let Some(f) = self.floor_ref_us {
                s += &format!("; floor {f:.2} us");
            }
            if let Some(g) = self.gb10_floor_us() {
                s += &format!(", GB10 floor {g:.1} us (projection at 230 GB/s)");
            }
        }
        if let Some(n) = &self.notes {
            s += &format!(" [{n}]");
        }
        s
    }
}

/// A measurement on its way to a [`Record`]: times in seconds for what was timed, divided by
/// [`Sample::per`] into the unit.
#[derive(Clone, Debug)]
pub struct Sample {
    group: String,
    case: String,
    unit: Unit,
    times: (f64, f64, f64),
    percentiles: bool,
    bytes: Option<u64>,
    launches: Option<u32>,
    notes: Option<String>,
}

impl Sample {
    /// (median, p10, p90) seconds, as [`replay_times`] gives them.
    pub fn new(group: impl Into<String>, case: impl Into<String>, unit: Unit, times: (f64, f64, f64)) -> Self {
        Sample {
            group: group.into(),
            case: case.into(),
            unit,
            times,
            percentiles: true,
            bytes: None,
            launches: None,
            notes: None,
        }
    }

    /// A median alone (a sweep's candidates, a difference of medians).
    pub fn median(group: impl Into<String>, case: impl Into<String>, unit: Unit, median: f64) -> Self {
        Sample { percentiles: false, ..Sample::new(group, case, unit, (median, median, median)) }
    }

    /// The times were for `n` units (layers, sites, launches in one replay).
    pub fn per(mut self, n: usize) -> Self {
        let n = n as f64;
        self.times = (self.times.0 / n, self.times.1 / n, self.times.2 / n);
        self
    }

    pub fn bytes(mut self, bytes: usize) -> Self {
        self.bytes = Some(bytes as u64);
        self
    }

    pub fn launches(mut self, n: usize) -> Self {
        self.launches = Some(n as u32);
        self
    }

    pub fn notes(mut self, notes: impl Into<String>) -> Self {
        self.notes = Some(notes.into());
        self
    }
}

/// The one writer of every bench: fills in the device, arch, date and derived figures, prints the
/// record's line and appends it to `$OUT/bench-<bench>.jsonl` (or `target/`).
#[derive(Debug)]
pub struct Recorder {
    bench: String,
    device: String,
    arch: String,
    copy_bw: Option<f64>,
    file: Option<std::fs::File>,
}

impl Recorder {
    /// `copy_bw`: the device's copy bandwidth measured in the same run, bytes/s, if the bench
    /// measures it.
    pub fn new(gpu: &Gpu, bench: &str, copy_bw: Option<f64>) -> Self {
        let dir = std::env::var_os("OUT").map(std::path::PathBuf::from).unwrap_or_else(|| "target".into());
        let path = dir.join(format!("bench-{bench}.jsonl"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        if let Err(e) = &file {
            eprintln!("{}: {e} (records printed only)", path.display());
        }
        Recorder {
            bench: bench.into(),
            device: gpu.info().name.clone(),
            arch: gpu.arch().to_string(),
            copy_bw,
            file: file.ok(),
        }
    }

    /// The record of `s`, without printing or writing it.
    pub fn make(&self, s: Sample) -> Record {
        let (median, p10, p90) = s.times;
        let floor = |bw: f64| s.bytes.map(|b| b as f64 / bw * 1e6);
        let floor_ref_us = floor(H200_REFERENCE_BYTES_PER_S);
        Record {
            bench: self.bench.clone(),
            group: s.group,
            case: s.case,
            device: self.device.clone(),
            arch: self.arch.clone(),
            date: utc_now(),
            unit: s.unit,
            median_us: median * 1e6,
            p10_us: s.percentiles.then_some(p10 * 1e6),
            p90_us: s.percentiles.then_some(p90 * 1e6),
            bytes: s.bytes,
            copy_gb_s: self.copy_bw.map(|c| c / 1e9),
            floor_copy_us: self.copy_bw.and_then(floor),
            floor_ref_us,
            fraction: floor_ref_us.map(|f| f / (median * 1e6)),
            launches: s.launches,
            notes: s.notes,
        }
    }

    /// Prints `s`'s line and appends its record.
    pub fn record(&mut self, s: Sample) -> Record {
        let r = self.make(s);
        println!("{}", r.line());
        self.write(&r);
        r
    }

    /// Appends `s`'s record without printing it (for a sweep's many candidates).
    pub fn record_quietly(&mut self, s: Sample) -> Record {
        let r = self.make(s);
        self.write(&r);
        r
    }

    fn write(&mut self, r: &Record) {
        if let Some(f) = self.file.as_mut() {
            let line = serde_json::to_string(r).expect("a record serialises");
            if let Err(e) = writeln!(f, "{line}") {
                eprintln!("bench-{}.jsonl: {e}", self.bench);
            }
        }
    }
}

/// Now, UTC, as `YYYY-MM-DDTHH:MMZ` (civil date from days since the epoch, Howard Hinnant's
/// algorithm; no date crate for one timestamp).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MMZ`.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}Z")
}

/// One eager launch of `args(0)` (so that a bad argument fails here, not inside a capture), then
/// a graph of `launches` launches of `args(i)`: the chain a bench replays.
///
/// # Safety
/// Every `args(i)` must address buffers that hold what the kernel reads and writes, alive as long
/// as the graph.
pub unsafe fn capture_chain<K: KernelDef>(
    gpu: &Gpu,
    k: &LoadedKernel<K>,
    launches: usize,
    args: impl Fn(usize) -> K::Args,
) -> Graph {
    // SAFETY: the caller vouches for every launch's arguments.
    unsafe { k.launch(gpu, &args(0)) }.expect("launch");
    gpu.synchronize().expect("sync");
    gpu.capture(|| {
        for i in 0..launches {
            // SAFETY: as above.
            unsafe { k.launch(gpu, &args(i)) }?;
        }
        Ok(())
    })
    .expect("capture")
}

#[cfg(test)]
mod tests {
    use super::{Record, Recorder, Sample, Unit, format_utc};

    #[test]
    fn a_sample_becomes_a_record_and_round_trips() {
        let rec = Recorder {
            bench: "moe".into(),
            device: "NVIDIA H200".into(),
            arch: "sm_90".into(),
            copy_bw: Some(4.0e12),
            file: None,
        };
        // 8 layers in 80 µs; 4.27 MB a layer: 1 µs at 4.27 TB/s, 10% of it.
        let r = rec.make(
            Sample::new("layer", "nvfp4", Unit::Layer, (80e-6, 72e-6, 88e-6)).per(8).bytes(4_270_000).launches(3),
        );
        assert!((r.median_us - 10.0).abs() < 1e-9 && (r.p10_us.unwrap() - 9.0).abs() < 1e-9);
        assert!((r.floor_ref_us.unwrap() - 1.0).abs() < 1e-9 && (r.fraction.unwrap() - 0.1).abs() < 1e-9);
        assert!((r.floor_copy_us.unwrap() - 1.0675).abs() < 1e-9 && r.copy_gb_s == Some(4000.0));
        assert!((r.gb_per_s().unwrap() - 427.0).abs() < 1e-9);
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"unit\":\"per layer\"") && !json.contains("notes"), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
        // A median alone has no percentiles; no bytes, no floors.
        let m = rec.make(Sample::median("sweep Router", "Tiles { .. }", Unit::Layer, 5e-6));
        assert!(m.p10_us.is_none() && m.bytes.is_none() && m.fraction.is_none());
        assert!(r.line().contains("10.00 us per layer (p10 9.00, p90 11.00), 3 launches, 4.27 MB, 427 GB/s, 10.0%"));
    }

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00Z");
        assert_eq!(format_utc(951_782_400 + 3600 * 13 + 60 * 7), "2000-02-29T13:07Z");
        assert_eq!(format_utc(1_795_999_500), "2026-11-30T00:45Z");
    }
}

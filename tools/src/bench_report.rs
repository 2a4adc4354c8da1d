//! `bench-report`: BENCHMARKS.md's generated tables from the benches' records.
//!
//! Every bench writes one [`Record`] a line to `bench-<bench>.jsonl`. BENCHMARKS.md is prose with
//! hand-written tables; inside it, regions delimited by `<!-- bench-report:<bench> begin -->` and
//! `<!-- bench-report:<bench> end -->` hold a table rendered from that bench's records, and only
//! those regions are rewritten. A region whose bench has no records keeps its old text (a partial
//! run never deletes figures), with a warning.
//!
//! The PyTorch comparison scripts (`benches/*_torch.py`) write `bench-<x>-torch.jsonl` in their
//! own schema: those files are skipped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use flashnext::bench::{GB10_STREAMING_BYTES_PER_S, H200_REFERENCE_BYTES_PER_S, Record};

/// Benches whose figures are per-kernel bytes-bound, so their floors, fractions of the bandwidth and
/// the projection of their bytes onto the GB10's 230 GB/s mean something (not PLE: its rows cross
/// the host bus; not sampling: no bytes). The others' tables give the time and GB/s only. The
/// embedding and PLE's ids and gate/conv (`ple_kernels`) are latency-bound at the step's shape, but
/// their bytes are all device memory's: the floors are true floors, and the fraction says how far
/// a launch's latency keeps them from it.
const BYTES_BOUND: &[&str] =
    &["gemv", "gemv_nvfp4", "moe", "gdn", "mix", "qsa", "qsa_layer", "lm_head", "step", "embed", "ple_kernels"];

/// A record with where it came from (for the order and the latest of duplicates).
#[derive(Clone, Debug)]
pub struct Located {
    pub record: Record,
    pub file: PathBuf,
    pub line: usize,
}

/// Every record of every `bench-*.jsonl` in `dir` (PyTorch files skipped), by bench, in file
/// order. Errors name the file and line of a malformed record.
pub fn read_dir(dir: &Path) -> Result<BTreeMap<String, Vec<Located>>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("--in {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("bench-") && name.ends_with(".jsonl")
        })
        .collect();
    files.sort();
    let mut by_bench: BTreeMap<String, Vec<Located>> = BTreeMap::new();
    let mut read = 0;
    for file in files {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with("-torch.jsonl") {
            eprintln!("note: {}: a PyTorch comparison (its own schema), not rendered", file.display());
            continue;
        }
        read += 1;
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record: Record = serde_json::from_str(line)
                .map_err(|e| format!("{}:{}: malformed record: {e}", file.display(), i + 1))?;
            by_bench.entry(record.bench.clone()).or_default().push(Located { record, file: file.clone(), line: i + 1 });
        }
    }
    if read == 0 {
        return Err(format!("--in {}: no bench-*.jsonl files there", dir.display()));
    }
    Ok(by_bench)
}

/// One generated region of the document.
#[derive(Debug)]
struct Region {
    bench: String,
    /// Line indices of the begin and end markers.
    begin: usize,
    end: usize,
}

fn marker(line: &str) -> Option<(&str, bool)> {
    let rest = line.trim().strip_prefix("<!-- bench-report:")?.strip_suffix("-->")?.trim();
    let (bench, which) = rest.rsplit_once(' ')?;
    match which {
        "begin" => Some((bench.trim(), true)),
        "end" => Some((bench.trim(), false)),
        _ => None,
    }
}

fn regions(doc: &str, name: &str) -> Result<Vec<Region>, String> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize)> = None;
    for (i, line) in doc.lines().enumerate() {
        let Some((bench, begin)) = marker(line) else { continue };
        match (&open, begin) {
            (None, true) => open = Some((bench.to_owned(), i)),
            (Some((b, at)), true) => {
                return Err(format!(
                    "{name}:{}: `{bench}` begins inside the region `{b}` begun at line {} (that one has no end marker)",
                    i + 1,
                    at + 1
                ));
            }
            (None, false) => return Err(format!("{name}:{}: end marker of `{bench}` without its begin", i + 1)),
            (Some((b, at)), false) => {
                if b != bench {
                    return Err(format!(
                        "{name}:{}: end marker of `{bench}` closes the region `{b}` begun at line {}",
                        i + 1,
                        at + 1
                    ));
                }
                out.push(Region { bench: bench.to_owned(), begin: *at, end: i });
                open = None;
            }
        }
    }
    if let Some((b, at)) = open {
        return Err(format!("{name}:{}: the region `{b}` has no end marker (`<!-- bench-report:{b} end -->`)", at + 1));
    }
    Ok(out)
}

/// What a run of the tool did to the document.
#[derive(Debug, Default)]
pub struct Outcome {
    pub text: String,
    pub rendered: Vec<String>,
    pub warnings: Vec<String>,
}

/// `doc` with every region whose bench has records rendered anew; `name` for the messages.
pub fn update(doc: &str, name: &str, records: &BTreeMap<String, Vec<Located>>) -> Result<Outcome, String> {
    let regions = regions(doc, name)?;
    let lines: Vec<&str> = doc.lines().collect();
    let mut out = Outcome::default();
    let mut next = 0;
    for r in &regions {
        for l in &lines[next..=r.begin] {
            out.text += l;
            out.text.push('\n');
        }
        match records.get(&r.bench) {
            Some(rs) if !rs.is_empty() => {
                out.text += &render(&r.bench, rs);
                out.rendered.push(r.bench.clone());
            }
            _ => {
                out.warnings.push(format!(
                    "{name}:{}: no records of the bench `{}`: its region is kept as it was",
                    r.begin + 1,
                    r.bench
                ));
                for l in &lines[r.begin + 1..r.end] {
                    out.text += l;
                    out.text.push('\n');
                }
            }
        }
        next = r.end;
    }
    for l in &lines[next..] {
        out.text += l;
        out.text.push('\n');
    }
    if !doc.ends_with('\n') {
        out.text.pop();
    }
    for bench in records.keys() {
        if !regions.iter().any(|r| &r.bench == bench) {
            out.warnings.push(format!("records of the bench `{bench}` have no region in {name}"));
        }
    }
    Ok(out)
}

fn is_sweep(group: &str) -> bool {
    group.starts_with("sweep")
}

/// A time in µs, as ms from a millisecond up.
fn time(us: f64) -> String {
    if us >= 1000.0 { format!("{:.3} ms", us / 1e3) } else { format!("{us:.2} µs") }
}

fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} KB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

fn date(d: &str) -> String {
    match d.strip_suffix('Z') {
        Some(d) => format!("{} UTC", d.replace('T', " ")),
        None => d.to_owned(),
    }
}

/// The region's text (between its markers, blank lines around it): a line naming the devices and
/// dates, the table, and a note on the sweeps. The latest record of each (group, case, device)
/// counts; groups in the order they first appear, cases too; a sweep group (`sweep …`) shows its
/// fastest candidate.
pub fn render(bench: &str, records: &[Located]) -> String {
    // The latest of duplicates: by date, then by place (later files, later lines win).
    let mut latest: Vec<&Located> = Vec::new();
    for l in records {
        let r = &l.record;
        match latest.iter_mut().find(|k| {
            let k = &k.record;
            k.group == r.group && k.case == r.case && k.device == r.device
        }) {
            Some(k) => {
                if (r.date.as_str(), &l.file, l.line) >= (k.record.date.as_str(), &k.file, k.line) {
                    *k = l;
                }
            }
            None => latest.push(l),
        }
    }
    let mut groups: Vec<&str> = Vec::new();
    for l in &latest {
        if !groups.contains(&l.record.group.as_str()) {
            groups.push(&l.record.group);
        }
    }
    let mut devices: Vec<String> = Vec::new();
    for l in &latest {
        let d = format!("{} ({})", l.record.device, l.record.arch);
        if !devices.contains(&d) {
            devices.push(d);
        }
    }
    let (first, last) = latest.iter().fold((None::<&str>, None::<&str>), |(a, b), l| {
        let d = l.record.date.as_str();
        (Some(a.map_or(d, |a| a.min(d))), Some(b.map_or(d, |b| b.max(d))))
    });
    let (first, last) = (first.unwrap_or(""), last.unwrap_or(""));
    let when = if first == last { date(first) } else { format!("{} to {}", date(first), date(last)) };
    let multi_device = devices.len() > 1;
    let bytes_bound = BYTES_BOUND.contains(&bench);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nGenerated by `bench-report` from `bench-{bench}.jsonl` (rerun it, do not edit): {}, {when}.\n",
        devices.join(", ")
    );
    let mut head = vec!["group", "case"];
    if multi_device {
        head.push("device");
    }
    head.extend(["median", "p10 – p90", "launches", "bytes", "GB/s"]);
    if bytes_bound {
        head.extend(["floor at 4.27 TB/s", "of 4.27 TB/s", "of copy BW", "GB10 at 230 GB/s (projected floor)"]);
    }
    let _ = writeln!(s, "| {} |", head.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(head.len()));
    let mut swept = false;
    for g in groups {
        let mut rows: Vec<&Record> = latest.iter().map(|l| &l.record).filter(|r| r.group == g).collect();
        let candidates = rows.len();
        if is_sweep(g) {
            // A sweep shows its fastest candidate only.
            rows.sort_by(|a, b| a.median_us.total_cmp(&b.median_us));
            rows.truncate(1);
            swept = true;
        }
        for r in rows {
            let mut group = format!("{} ({})", r.group, r.unit.as_str());
            if is_sweep(g) {
                group += &format!(", fastest of {candidates}");
            }
            let mut cells = vec![group, r.case.replace('|', "\\|")];
            if multi_device {
                cells.push(r.device.clone());
            }
            cells.push(time(r.median_us));
            cells.push(match (r.p10_us, r.p90_us) {
                (Some(a), Some(b)) if a >= 1000.0 => format!("{:.3} – {:.3}", a / 1e3, b / 1e3),
                (Some(a), Some(b)) => format!("{a:.2} – {b:.2}"),
                _ => String::new(),
            });
            cells.push(r.launches.map(|n| n.to_string()).unwrap_or_default());
            cells.push(r.bytes.map(bytes).unwrap_or_default());
            cells.push(
                r.gb_per_s().map(|g| if g < 10.0 { format!("{g:.2}") } else { format!("{g:.0}") }).unwrap_or_default(),
            );
            if !bytes_bound {
                let _ = writeln!(s, "| {} |", cells.join(" | "));
                continue;
            }
            let floor = r.floor_ref_us.or(r.bytes.map(|b| b as f64 / H200_REFERENCE_BYTES_PER_S * 1e6));
            cells.push(floor.map(time).unwrap_or_default());
            let fraction = r.fraction.or(floor.map(|f| f / r.median_us));
            cells.push(fraction.map(|f| format!("{:.1}%", 100.0 * f)).unwrap_or_default());
            let of_copy = match (r.gb_per_s(), r.copy_gb_s) {
                (Some(g), Some(c)) => format!("{:.1}%", 100.0 * g / c),
                _ => String::new(),
            };
            cells.push(of_copy);
            cells.push(r.bytes.map(|b| time(b as f64 / GB10_STREAMING_BYTES_PER_S * 1e6)).unwrap_or_default());
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
    }
    if swept {
        let _ = writeln!(s, "\nA sweep's row is its fastest candidate; every candidate is in the records.");
    }
    s.push('\n');
    s
}

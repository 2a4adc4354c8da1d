//! Memory over a long sequence: the device's free memory (`cuMemGetInfo`) and the process's
//! resident set (VmRSS of /proc/self/status) sampled every so many tokens, and the check that both
//! stay flat once the run is warm (modules loaded, the graph instantiated, the allocator's pools
//! grown): nothing a token does may keep memory.

/// One sample, taken after `generated` new tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub generated: usize,
    /// The device's free and total memory, bytes.
    pub device_free: usize,
    pub device_total: usize,
    /// The process's resident set, kB.
    pub rss_kb: u64,
    /// Seconds since the decode began.
    pub seconds: f64,
}

/// The VmRSS line of a /proc/<pid>/status text, in kB.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let value = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(value),
        Some(_) => None,
    }
}

/// This process's resident set, kB.
pub fn rss_kb() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("/proc/self/status: {e}"))?;
    parse_vm_rss(&status).ok_or_else(|| "/proc/self/status has no VmRSS line in kB".to_owned())
}

/// What "flat" allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Tokens of warm-up: the first sample at or past this many is the baseline.
    pub warmup: usize,
    /// The most device memory the run may take after the baseline, bytes.
    pub device_bytes: u64,
    /// The most the resident set may grow after the baseline, kB.
    pub rss_kb: u64,
}

/// The largest growth after the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Growth {
    /// The baseline sample's index.
    pub baseline: usize,
    /// Device memory taken since the baseline (free memory lost), bytes; negative: freed.
    pub device_bytes: i64,
    pub rss_kb: i64,
    /// Samples after the baseline that were checked.
    pub checked: usize,
}

/// The growth after the baseline, or why it is not flat (which sample, by how much).
pub fn check_flat(samples: &[Sample], limits: Limits) -> Result<Growth, String> {
    let Some(baseline) = samples.iter().position(|s| s.generated >= limits.warmup) else {
        return Err(format!("no sample at or past the warm-up of {} tokens", limits.warmup));
    };
    let base = samples[baseline];
    let mut growth = Growth { baseline, device_bytes: 0, rss_kb: 0, checked: 0 };
    let mut problems = Vec::new();
    for s in &samples[baseline + 1..] {
        let device = base.device_free as i64 - s.device_free as i64;
        let rss = s.rss_kb as i64 - base.rss_kb as i64;
        growth.device_bytes = growth.device_bytes.max(device);
        growth.rss_kb = growth.rss_kb.max(rss);
        growth.checked += 1;
        if device > limits.device_bytes as i64 {
            problems.push(format!(
                "after {} tokens the device has {device} bytes less free than after {} (allowed {})",
                s.generated, base.generated, limits.device_bytes
            ));
        }
        if rss > limits.rss_kb as i64 {
            problems.push(format!(
                "after {} tokens the resident set is {rss} kB above its size after {} (allowed {} kB)",
                s.generated, base.generated, limits.rss_kb
            ));
        }
    }
    if growth.checked == 0 {
        problems.push(format!("no sample after the baseline (after {} tokens) to compare with it", base.generated));
    }
    if problems.is_empty() { Ok(growth) } else { Err(problems.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(generated: usize, device_free: usize, rss_kb: u64) -> Sample {
        Sample { generated, device_free, device_total: 1 << 40, rss_kb, seconds: 0.0 }
    }

    const LIMITS: Limits = Limits { warmup: 10, device_bytes: 0, rss_kb: 1024 };

    #[test]
    fn vm_rss_is_read_in_kb() {
        let status = "Name:\tlongrun\nVmPeak:\t  999 kB\nVmRSS:\t   123456 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(123_456));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: 12 MB\n"), None);
        // This process has one.
        assert!(rss_kb().expect("VmRSS") > 0);
    }

    #[test]
    fn warm_up_growth_is_allowed_and_later_growth_is_not() {
        // Memory taken during the warm-up (before token 10) is fine; flat after it.
        let flat = [sample(0, 1000, 500), sample(10, 900, 2000), sample(20, 900, 2100), sample(30, 900, 2000)];
        let g = check_flat(&flat, LIMITS).expect("flat");
        assert_eq!((g.baseline, g.device_bytes, g.rss_kb, g.checked), (1, 0, 100, 2));

        let leaks_device = [sample(0, 1000, 500), sample(10, 900, 2000), sample(20, 898, 2000)];
        let e = check_flat(&leaks_device, LIMITS).expect_err("device growth");
        assert!(e.contains("after 20 tokens") && e.contains("2 bytes less free"), "{e}");

        let leaks_host = [sample(0, 1000, 500), sample(10, 900, 2000), sample(20, 900, 3025)];
        let e = check_flat(&leaks_host, LIMITS).expect_err("host growth");
        assert!(e.contains("1025 kB"), "{e}");
    }

    #[test]
    fn too_few_samples_are_not_a_pass() {
        assert!(check_flat(&[sample(0, 1, 1)], LIMITS).is_err());
        assert!(check_flat(&[sample(0, 1, 1), sample(10, 1, 1)], LIMITS).is_err());
    }
}

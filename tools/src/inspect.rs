//! `kernel-inspect`: one kernel as the engine compiles it, for reading what runs. The CUDA C it
//! emits at a tile set, the resources ptxas gave the cubin, and its SASS with a one-line map of
//! where the global loads stand against the grid dependency wait, the barriers and the products.
//!
//! Why a tool: BENCHMARKS.md explains kernels' times by their instruction order ("every weight
//! load is issued before the wait", "ptxas moved the loads next to their uses"). Those claims come
//! from the SASS of the cubin NVRTC makes, which nothing else in the repository shows; with this,
//! anyone with NVRTC can check them (the SASS needs `cuobjdump` and `nvdisasm`, from a CUDA
//! toolkit or NVIDIA's `nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` wheels).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use engine::kernels::ALL;
use kernel_dsl::{AnyKernel, Arch, Kernel};

/// The kernel named `name`, or an error that lists every kernel.
pub fn find(name: &str) -> Result<&'static dyn AnyKernel, String> {
    ALL.iter().copied().find(|k| k.name() == name).ok_or_else(|| {
        let names: Vec<&str> = ALL.iter().map(|k| k.name()).collect();
        format!("no kernel `{name}`; the kernels are: {}", names.join(", "))
    })
}

/// `kernel` specialised for `arch` at its default tiles (`tiles` None) or at the declared tile
/// set written `tiles` (`NAME=value` pairs in any order, as the tuning tables write them:
/// `LANES=16 WARPS=8 STEPS=10`; the tiles it does not name keep their defaults). A name the
/// kernel lacks, or a set that is not among its candidates, is refused with the default and a few
/// candidates, so a typo does not pass for a tile set.
pub fn at_tiles(kernel: &dyn AnyKernel, arch: Arch, tiles: Option<&str>) -> Result<Kernel, String> {
    let default = kernel.default_kernel(arch).map_err(|e| e.to_string())?;
    let Some(text) = tiles else { return Ok(default) };
    let mut want = normalise(&default.key.tiles_string())?;
    for (name, value) in normalise(text)? {
        match want.iter_mut().find(|(n, _)| *n == name) {
            Some(pair) => pair.1 = value,
            None => {
                return Err(format!(
                    "`{text}`: {} has no tile {name} (its tiles, at their defaults: `{}`)",
                    kernel.name(),
                    default.key.tiles_string()
                ));
            }
        }
    }
    if normalise(&default.key.tiles_string())? == want {
        return Ok(default);
    }
    let candidates: Vec<Kernel> = kernel.candidate_kernels(arch).into_iter().filter_map(Result::ok).collect();
    if let Some(k) = candidates.iter().find(|k| normalise(&k.key.tiles_string()).ok().as_ref() == Some(&want)) {
        return Ok(k.clone());
    }
    let shown: Vec<String> = candidates.iter().take(6).map(|k| format!("`{}`", k.key.tiles_string())).collect();
    Err(format!(
        "`{text}` is not a tile set of {} (default `{}`; {} candidates, for example {})",
        kernel.name(),
        default.key.tiles_string(),
        candidates.len(),
        shown.join(", ")
    ))
}

/// `NAME=value` pairs sorted by name, so that their order does not matter.
fn normalise(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for part in text.split_whitespace() {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not NAME=value (tiles read `LANES=16 WARPS=8`)"))?;
        pairs.push((name.to_ascii_uppercase(), value.to_ascii_lowercase()));
    }
    pairs.sort();
    Ok(pairs)
}

/// `cuobjdump` from `$CUDA_PATH/bin`, `/usr/local/cuda/bin`, the `PATH` or the wheels the test
/// command installs into the checkout's `.nvrtc-tools/`.
pub fn find_cuobjdump() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("CUDA_PATH") {
        dirs.push(PathBuf::from(p).join("bin"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.nvrtc-tools/nvidia/cu13/bin"));
    dirs.into_iter().map(|d| d.join("cuobjdump")).find(|f| f.is_file())
}

/// The SASS of `cubin` as `cuobjdump -sass` prints it. cuobjdump runs `nvdisasm`, looked up on
/// the `PATH` with cuobjdump's own folder first (the wheels install them side by side only when
/// both are asked for, so a missing one is named).
pub fn disassemble(cubin: &[u8], cuobjdump: &Path, scratch: &Path) -> Result<String, String> {
    // One file a process, so that two runs at once do not read each other's cubin.
    let file = scratch.join(format!("kernel-inspect-{}.cubin", std::process::id()));
    std::fs::write(&file, cubin).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut path = cuobjdump.parent().map(|d| vec![d.to_path_buf()]).unwrap_or_default();
    if let Some(p) = std::env::var_os("PATH") {
        path.extend(std::env::split_paths(&p));
    }
    let joined = std::env::join_paths(path).map_err(|e| e.to_string())?;
    let out = Command::new(cuobjdump)
        .arg("-sass")
        .arg(&file)
        .env("PATH", joined)
        .output()
        .map_err(|e| format!("{}: {e}", cuobjdump.display()));
    let _ = std::fs::remove_file(&file);
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !text.contains("Function") || err.contains("nvdisasm") {
        return Err(format!("{} -sass failed: {}{}", cuobjdump.display(), err.trim(), text.trim()));
    }
    Ok(text)
}

/// What the SASS of one kernel says about its memory traffic and its order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Instructions, the NOPs of the padding left out.
    pub instructions: usize,
    /// Global loads by their SASS form (`LDG.E.NA.64`, `LDG.E.U8.CONSTANT`, ...), in first-seen order.
    pub loads: Vec<(String, usize)>,
    /// Every opcode (its name before the first `.`: `LOP3`, `FFMA`, `IMAD`) with its count, the
    /// most frequent first (ties in first-seen order). A static count: it says what a kernel's
    /// unrolled loop is made of, and so how many instructions an element costs where the issue
    /// rate bounds it (BENCHMARKS.md, step section, session 29), not how often each runs.
    pub opcodes: Vec<(String, usize)>,
    /// The instructions after the first grid dependency wait (`ACQBULK`) by opcode, most frequent
    /// first, as [`Summary::opcodes`]; None without a wait. In a kernel that loads its weights
    /// before the wait this is the work left once the predecessor ends (BENCHMARKS.md, GDN
    /// section: 955 against 2,254 a thread for the input projection's two paths).
    pub after_wait: Option<Vec<(String, usize)>>,
    /// The map, one letter an event in program order (see [`Summary::LEGEND`]).
    pub order: String,
}

impl Summary {
    /// The rounds of global loads after the grid dependency wait, from [`Summary::order`]: the
    /// first load after the wait starts one, and so does each load after a `^` (a warp that
    /// stopped for a load's data) since the last round began. A static count over the listing in
    /// program order: a loop's body counts once, and the paths of a branch add up. Loads a warp
    /// issues together cost about one latency; each further round costs one more (BENCHMARKS.md,
    /// step section, session 47). None without a wait.
    pub fn load_rounds_after_wait(&self) -> Option<usize> {
        let (_, after) = self.order.split_once('W')?;
        let mut rounds = 0;
        let mut waited = true;
        for c in after.chars() {
            match c {
                '^' => waited = true,
                'G' | 'g' if waited => {
                    rounds += 1;
                    waited = false;
                }
                _ => {}
            }
        }
        Some(rounds)
    }

    /// What the letters of [`Summary::order`] stand for.
    pub const LEGEND: &'static str = "G a global load of 8 or 16 bytes, g a narrower one, W the grid dependency wait \
        (griddepcontrol.wait, ACQBULK), P the dependents' launch (PREEXIT), B a barrier, S/L a shared store/load, \
        h an f16x2 product (HFMA2), m a tensor-core product (HMMA), | a branch, X an exit, \
        ^ an instruction that waits for the data of a global load before it (its scoreboard)";
}

/// Reads `cuobjdump -sass` output (one kernel) into a [`Summary`].
///
/// Each instruction's second 64-bit word (the line after it) holds its scheduling controls
/// (bits 105 to 125 of the 128: stall, yield, the scoreboard its result sets, the one its
/// operands' read sets, and the mask of scoreboards it waits for). A `^` in the order marks an
/// instruction that waits for a scoreboard a global load set: where a warp stops until a load's
/// data arrives, so a load after it starts a new round trip (a static map: branches and loops
/// are in program order, not in the order they run).
pub fn summarise(sass: &str) -> Summary {
    // (opcode with its modifiers, the second word when the listing has it)
    let mut listing: Vec<(String, Option<u64>)> = Vec::new();
    for line in sass.lines() {
        // Instruction lines: `/*0060*/  [@P0] OPCODE operands ;  /* 0x<first word> */`, then a
        // line `/* 0x<second word> */`.
        let Some(rest) = line.trim_start().strip_prefix("/*") else { continue };
        let Some((addr, rest)) = rest.split_once("*/") else { continue };
        if let Some(hex) = addr.trim().strip_prefix("0x") {
            if let (Some(last), Ok(word)) = (listing.last_mut(), u64::from_str_radix(hex, 16))
                && last.1.is_none()
                && rest.trim().is_empty()
            {
                last.1 = Some(word);
            }
            continue;
        }
        if !addr.chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let mut words = rest.split_whitespace();
        let mut op = words.next().unwrap_or("");
        if op.starts_with('@') {
            op = words.next().unwrap_or("");
        }
        let op = op.trim_end_matches(';');
        if op.is_empty() || op == "NOP" {
            continue;
        }
        // The second word, if the listing has it, comes on the next line.
        listing.push((op.to_owned(), None));
    }

    let mut instructions = 0;
    let mut loads: Vec<(String, usize)> = Vec::new();
    let mut opcodes: Vec<(String, usize)> = Vec::new();
    let mut after_wait: Option<Vec<(String, usize)>> = None;
    let mut order = String::new();
    // Scoreboards (0 to 5) a global load's result is counted on and no instruction has waited
    // for since.
    let mut load_boards = 0u64;
    for (op, second) in &listing {
        let op = op.as_str();
        instructions += 1;
        let base = op.split('.').next().unwrap_or(op);
        count(&mut opcodes, base);
        if let Some(after) = &mut after_wait {
            count(after, base);
        } else if base == "ACQBULK" {
            after_wait = Some(Vec::new());
        }
        if let Some(word) = second {
            let waits = (word >> 52) & 0x3f;
            if waits & load_boards != 0 {
                order.push('^');
                load_boards &= !waits;
            }
            let result_board = (word >> 46) & 7;
            if base == "LDG" && result_board < 6 {
                load_boards |= 1 << result_board;
            }
        }
        let letter = match base {
            "LDG" => {
                count(&mut loads, op);
                Some(if op.contains(".64") || op.contains(".128") { 'G' } else { 'g' })
            }
            "ACQBULK" => Some('W'),
            "PREEXIT" => Some('P'),
            "BAR" => Some('B'),
            "STS" => Some('S'),
            "LDS" => Some('L'),
            "HFMA2" => Some('h'),
            "HMMA" => Some('m'),
            "BRA" => Some('|'),
            "EXIT" => Some('X'),
            _ => None,
        };
        order.extend(letter);
    }
    // Stable: equal counts keep their first-seen order.
    opcodes.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    if let Some(after) = &mut after_wait {
        after.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    }
    Summary { instructions, loads, opcodes, after_wait, order }
}

/// One more of `key` in a first-seen-order tally.
fn count(tally: &mut Vec<(String, usize)>, key: &str) {
    match tally.iter_mut().find(|(k, _)| k == key) {
        Some((_, n)) => *n += 1,
        None => tally.push((key.to_owned(), 1)),
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} instructions", self.instructions)?;
        let loads: Vec<String> = self.loads.iter().map(|(op, n)| format!("{n} {op}")).collect();
        writeln!(f, "global loads: {}", if loads.is_empty() { "none".to_owned() } else { loads.join(", ") })?;
        let most: Vec<String> = self.opcodes.iter().take(12).map(|(op, n)| format!("{n} {op}")).collect();
        writeln!(f, "most frequent opcodes: {}", most.join(", "))?;
        match &self.after_wait {
            Some(after) => {
                let n: usize = after.iter().map(|(_, n)| n).sum();
                let most: Vec<String> = after.iter().take(8).map(|(op, n)| format!("{n} {op}")).collect();
                writeln!(f, "after the grid dependency wait: {n} instructions: {}", most.join(", "))?;
            }
            None => writeln!(f, "after the grid dependency wait: no wait")?,
        }
        if let Some(rounds) = self.load_rounds_after_wait() {
            writeln!(f, "load rounds after the wait: {rounds} (a load after a ^ starts one)")?;
        }
        writeln!(f, "order: {}", self.order)?;
        write!(f, "  ({})", Self::LEGEND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cuobjdump excerpt: loads on both sides of the wait, a predicated load, padding.
    const SASS: &str = "
        Function : k
        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */
        /*0060*/                   LDG.E.NA.64 R4, desc[UR4][R2.64] ;
        /*0070*/              @P0  LDG.E.U8.CONSTANT R6, desc[UR4][R2.64] ;
        /*0080*/                   ACQBULK ;
        /*0090*/                   LDG.E.NA.64 R8, desc[UR4][R2.64+0x8] ;   /* 0x0000080402087981 */
                                                                     /* 0x000f40000c1e1b00 */
        /*00a0*/                   HFMA2 R0, R4, R8, RZ ;   /* 0x0000000804007231 */
                                                                     /* 0x020fc00000000000 */
        /*00b0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00c0*/                   EXIT ;
        /*00d0*/                   BRA 0xd0;
        /*00e0*/                   NOP;
    ";

    #[test]
    fn the_summary_counts_loads_by_form_and_maps_them_against_the_wait() {
        let s = summarise(SASS);
        assert_eq!(s.instructions, 9);
        assert_eq!(s.loads, vec![("LDG.E.NA.64".to_owned(), 2), ("LDG.E.U8.CONSTANT".to_owned(), 1)]);
        // The product waits on scoreboard 5, which the load after the wait set.
        assert_eq!(s.order, "GgWG^hBX|");
        let opcodes: Vec<(&str, usize)> = s.opcodes.iter().map(|(o, n)| (o.as_str(), *n)).collect();
        assert_eq!(
            opcodes,
            vec![("LDG", 3), ("LDC", 1), ("ACQBULK", 1), ("HFMA2", 1), ("BAR", 1), ("EXIT", 1), ("BRA", 1)]
        );
        assert_eq!(s.opcodes.iter().map(|(_, n)| n).sum::<usize>(), s.instructions);
        assert!(s.to_string().contains("most frequent opcodes: 3 LDG, 1 LDC, 1 ACQBULK"), "{s}");
        // After the wait: the load, the product, the barrier, the exit and the branch.
        let after: Vec<(&str, usize)> =
            s.after_wait.as_deref().expect("a wait").iter().map(|(o, n)| (o.as_str(), *n)).collect();
        assert_eq!(after, vec![("LDG", 1), ("HFMA2", 1), ("BAR", 1), ("EXIT", 1), ("BRA", 1)]);
        assert!(s.to_string().contains("after the grid dependency wait: 5 instructions: 1 LDG, 1 HFMA2"), "{s}");
        // A wait on a scoreboard no load set is not a load's.
        let other = summarise(&SASS.replace("0x000f40000c1e1b00", "0x000e80000c1e1b00"));
        assert_eq!(other.order, "GgWGhBX|");
        assert_eq!(s.load_rounds_after_wait(), Some(1));
        assert!(s.to_string().contains("load rounds after the wait: 1"), "{s}");
        let no_wait = summarise(&SASS.replace("ACQBULK", "NOP"));
        assert_eq!(no_wait.after_wait, None);
        assert_eq!(no_wait.load_rounds_after_wait(), None);
        assert!(no_wait.to_string().contains("after the grid dependency wait: no wait"), "{no_wait}");
    }

    /// Rounds: loads together are one; a load after a wait for a load's data starts another;
    /// a wait before any load (for the loads before the grid dependency wait) starts none.
    #[test]
    fn load_rounds_count_the_loads_that_follow_a_wait_for_a_load() {
        let rounds = |order: &str| Summary { order: order.to_owned(), ..summarise(SASS) }.load_rounds_after_wait();
        assert_eq!(rounds("GGWGgGG^^hh"), Some(1));
        assert_eq!(rounds("GGW^^PGG|G^SG^G"), Some(3));
        assert_eq!(rounds("W|^X"), Some(0));
        assert_eq!(rounds("GG^G"), None);
        // The map of one warp before and after session 47's change to the router: five rounds
        // of four, then all twenty at once.
        assert_eq!(rounds("WP|GG^^|h|GGGG^^^^GGGG^^^^GGGG^^^^GGGG^^^^||GG^^|B"), Some(6));
        assert_eq!(rounds("WP|||hGGGGGGGGGGGGGGGGGGGG|^||h|B"), Some(1));
    }

    /// A tile set may name only the tiles it changes: the rest keep their defaults.
    #[test]
    fn a_partial_tile_set_keeps_the_defaults_of_the_tiles_it_does_not_name() {
        let k = find("gdn_in_proj_nvfp4").expect("the kernel");
        let full = at_tiles(k, Arch::Sm90, Some("ROWS=4 WARPS=4 MMA=0 DIRECT=1 STEPS=5 MIN_BLOCKS=0")).expect("full");
        let short = at_tiles(k, Arch::Sm90, Some("MMA=0 DIRECT=1 ROWS=4")).expect("partial");
        assert_eq!(short.key, full.key);
        let e = at_tiles(k, Arch::Sm90, Some("MMA=0 LANES=2")).expect_err("no such tile");
        assert!(e.contains("has no tile LANES"), "{e}");
        // The named tiles with the others' defaults must still be a candidate: MMA 0 alone keeps
        // the tensor-core path's 16 rows, and the f32 path takes at most four.
        assert!(at_tiles(k, Arch::Sm90, Some("MMA=0")).is_err());
    }

    #[test]
    fn tiles_are_matched_in_any_order_and_a_stranger_is_refused_with_the_choices() {
        let k = find("lm_head_argmax_nvfp4").expect("the kernel");
        let default = k.default_kernel(Arch::Sm90).expect("default");
        let tiles = default.key.tiles_string();
        let reversed: Vec<&str> = tiles.split(' ').rev().collect();
        let again = at_tiles(k, Arch::Sm90, Some(&reversed.join(" "))).expect("the default, reordered");
        assert_eq!(again.key, default.key);
        let cand = k.candidate_kernels(Arch::Sm90).into_iter().filter_map(Result::ok).next_back().expect("a candidate");
        let got = at_tiles(k, Arch::Sm90, Some(&cand.key.tiles_string())).expect("a candidate");
        assert_eq!(got.key, cand.key);
        let e = at_tiles(k, Arch::Sm90, Some("LANES=3")).expect_err("no such set");
        assert!(e.contains("not a tile set") && e.contains(&default.key.tiles_string()), "{e}");
        let e = at_tiles(k, Arch::Sm90, Some("LANES")).expect_err("not NAME=value");
        assert!(e.contains("NAME=value"), "{e}");
        let e = find("lm_head").err().expect("no such kernel");
        assert!(e.contains("lm_head_argmax_nvfp4") && e.contains("gemv_bf16"), "{e}");
    }
}

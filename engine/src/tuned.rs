//! Tuned tile tables: what `tools/autotune` chose for one device, and how the step plan takes it.
//!
//! A table (`tuned/<device-slug>.json`) belongs to one device name and architecture. It holds one
//! entry per tuning unit: a layer family (`moe`, `mix`, `gdn`, `lm_head`, `qsa`, `ple`) in one
//! weight format at one shape. An entry names, per knob (one kernel's tile set, or the lm_head's
//! waves), the kernel, its *version* (a hash of the kernel's CUDA at its default tiles and the DSL
//! version: it changes whenever the kernel's code or the emitter changes) and the chosen tiles,
//! and keeps every candidate that was tried with its resources and time.
//!
//! [`crate::step::StepPlan::for_device`] looks up each family the step uses. An entry is taken
//! only whole: every knob's version current, every tile set among the kernel's declared ones, and
//! the family's launches accepting the tiles at the plan's shapes. Otherwise the family keeps the
//! plan's own tiles (the defaults, or the first candidate that fits) and one line on stderr says
//! why (an entry that names another kernel for a knob, or lacks a knob the unit now has, is
//! reported stale like one whose versions changed). GDN's format names its two matrices' formats
//! ([`gdn_format`]); QSA's is its projections' (one unit per format and top-k kernel); PLE's is
//! its table rows'.

use std::path::{Path, PathBuf};

use kernel_dsl::{Arch, DevPtr, DevPtrMut, Kernel, KernelDef, TileSet};
use serde::{Deserialize, Serialize};

use crate::cuda::cache::stable_hash;
use crate::error::{Error, Result};
use crate::kernels::gdn::delta_rule_normed::gdn_delta_rule_normed;
use crate::kernels::gdn::in_proj::{gdn_in_proj_bf16, gdn_in_proj_nvfp4};
use crate::kernels::gemv_bf16::gemv_bf16;
use crate::kernels::gemv_nvfp4::gemv_nvfp4;
use crate::kernels::lm_head::{lm_head_argmax_bf16, lm_head_argmax_nvfp4};
use crate::kernels::mix::{mix_down_bf16, mix_down_nvfp4, mix_up_bf16, mix_up_nvfp4};
use crate::kernels::moe::down::{moe_down_bf16, moe_down_nvfp4};
use crate::kernels::moe::gate_up::{moe_gate_up_bf16, moe_gate_up_nvfp4};
use crate::kernels::moe::router::moe_router;
use crate::kernels::ple::gate_conv::ple_gate_conv;
use crate::kernels::ple::gather_bf16::ple_gather_bf16;
use crate::kernels::ple::gather_nvfp4::ple_gather_nvfp4;
use crate::kernels::qsa::attention::qsa_attention;
use crate::kernels::qsa::block_scores::qsa_block_scores;
use crate::kernels::qsa::combine::qsa_attention_combine;
use crate::kernels::qsa::prepare::qsa_prepare;
use crate::kernels::qsa::top_blocks::qsa_top_blocks;
use crate::kernels::qsa::top_blocks_grid::qsa_top_blocks_grid;
use crate::layers::gdn::{GdnLaunches, GdnShape, GdnTiles, InProj};
use crate::layers::lm_head::LmHeadTiles;
use crate::layers::mix::{self, MixLaunches, MixShape, MixTiles};
use crate::layers::moe::{self, MoeLaunches, MoeShape, MoeTiles};
use crate::layers::ple::{Gather, PleLaunches, PleShape, PleTiles};
use crate::layers::qsa::{QsaLaunches, QsaShape, QsaTiles, TopK};
use crate::model::ple_table::RowFormat;

/// One device's table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// The device's name as the driver reports it (`NVIDIA H200`, `NVIDIA GB10`).
    pub device: String,
    /// `sm_90`, `sm_121a`.
    pub arch: String,
    pub sms: u32,
    /// Shared memory one block may use.
    pub smem_per_block: u32,
    /// Chosen from compiled resources alone, never timed.
    pub untimed: bool,
    /// How the winners were chosen.
    pub rule: String,
    pub entries: Vec<Entry>,
}

/// One tuning unit's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub family: String,
    /// `nvfp4` or `bf16` (GDN: see [`gdn_format`]).
    pub format: String,
    /// The shape the unit was tuned at (its `Debug` form).
    pub shape: String,
    pub winner: Vec<Choice>,
    /// The winner's and the defaults' time per layer, when timed.
    pub us_per_layer: Option<f64>,
    pub default_us_per_layer: Option<f64>,
    pub candidates: Vec<Candidate>,
}

/// One knob's setting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub knob: String,
    pub kernel: String,
    pub version: String,
    /// `ROWS=2 WARPS=8`, or the waves as a number.
    pub tiles: String,
}

/// One candidate that was considered: a knob at one setting, the others at the best so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub knob: String,
    pub tiles: String,
    pub registers: Option<u32>,
    pub shared_bytes: Option<u32>,
    pub spills: Option<bool>,
    /// `ok`, or why it was set aside (`pruned: ...`, `wrong: ...`, `failed: ...`).
    pub verdict: String,
    pub us_per_layer: Option<f64>,
}

impl Table {
    pub fn read(path: &Path) -> Result<Table> {
        let text =
            std::fs::read_to_string(path).map_err(|e| Error::Buffer(format!("tuned table {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| Error::Buffer(format!("tuned table {}: {e}", path.display())))
    }

    /// Writes the table through a temporary file renamed into place, so an interrupted write
    /// leaves the previous table whole.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Buffer(e.to_string()))? + "\n";
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::Buffer(format!("{}: {e}", dir.display())))?;
        }
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| Error::Buffer(format!("writing {}: {e}", path.display())))
    }

    pub fn entry(&self, family: &str, format: &str, shape: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.family == family && e.format == format && e.shape == shape)
    }

    /// Puts `entry` in place of the one with the same key, or adds it.
    pub fn upsert(&mut self, entry: Entry) {
        match self
            .entries
            .iter_mut()
            .find(|e| e.family == entry.family && e.format == entry.format && e.shape == entry.shape)
        {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
    }
}

/// A file name for a device: `NVIDIA H200` → `nvidia-h200`.
pub fn device_slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
    }
    s.trim_end_matches('-').to_owned()
}

/// The committed tables: `tuned/` at the repository root.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tuned")
}

/// The table for a device, if any: `FLASHNEXT_TUNED` names a table file, a folder of tables, or
/// `off`; without it the committed `tuned/` folder is searched. In a folder, the table whose device
/// and architecture match is taken.
pub fn find_for(device: &str, arch: Arch) -> std::result::Result<Table, String> {
    let setting = std::env::var_os("FLASHNEXT_TUNED").map(PathBuf::from);
    if setting.as_deref() == Some(Path::new("off")) {
        return Err("FLASHNEXT_TUNED=off".into());
    }
    let place = setting.unwrap_or_else(default_dir);
    if place.is_file() {
        let t = Table::read(&place).map_err(|e| e.to_string())?;
        return if t.device == device && t.arch == arch.to_string() {
            Ok(t)
        } else {
            Err(format!("{} is for {} {}", place.display(), t.device, t.arch))
        };
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&place)
        .map_err(|e| format!("{}: {e}", place.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .filter_map(|p| Table::read(p).ok())
        .find(|t| t.device == device && t.arch == arch.to_string())
        .ok_or_else(|| format!("no table for {device} {arch} in {}", place.display()))
}

/// A kernel's version in tables: a hash of its CUDA at the default tiles for `arch`, and of the
/// DSL version. Any change to the kernel's code, its defaults or the emitter changes it.
pub fn kernel_version<K: KernelDef>(arch: Arch) -> String {
    match K::specialize(&K::Tiles::DEFAULT, arch) {
        Ok(k) => {
            let source = kernel_dsl::emit::cuda(&k);
            let dsl = kernel_dsl::DSL_VERSION.to_string();
            format!("{:016x}", stable_hash(&[source.as_bytes(), dsl.as_bytes()]))
        }
        Err(e) => format!("unspecialisable: {}", e.message),
    }
}

/// A tile set as text: `ROWS=2 WARPS=8`.
pub fn tiles_string<T: TileSet>(t: &T) -> String {
    t.values().iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ")
}

/// The defaults, then the declared candidates not equal to them.
pub fn tile_choices<T: TileSet>() -> Vec<T> {
    let mut v = vec![T::DEFAULT];
    for t in T::candidates() {
        if !v.contains(&t) {
            v.push(t);
        }
    }
    v
}

type Boxed<F> = Box<F>;
/// Why a setting does not fit, or Ok.
type Verdict = std::result::Result<(), String>;
type Setter<S> = dyn Fn(&mut S, &str) -> bool + Send + Sync;
type Checker<S> = dyn Fn(&S) -> Verdict + Send + Sync;
type Specialiser<S> = dyn Fn(&S, Arch) -> Option<std::result::Result<Kernel, String>> + Send + Sync;

/// One thing a unit tunes: a kernel's tile set inside the family's tile struct `S`, or a grid
/// setting (the lm_head's waves).
pub struct Knob<S> {
    pub name: &'static str,
    /// The kernel's name, or `grid` for a setting that is no kernel's tiles.
    pub kernel: &'static str,
    /// Every setting, defaults first, as text.
    pub choices: Vec<String>,
    /// The kernel's tiles that only the whole step can time (`TileSet::CHOSEN_IN_STEP`): the
    /// autotuner holds them at the plan's value.
    pub chosen_in_step: &'static [&'static str],
    get: Boxed<dyn Fn(&S) -> String + Send + Sync>,
    set: Boxed<Setter<S>>,
    fits: Boxed<Checker<S>>,
    specialize: Boxed<Specialiser<S>>,
    version: Boxed<dyn Fn(Arch) -> String + Send + Sync>,
}

impl<S> std::fmt::Debug for Knob<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Knob({} of {}, {} choices)", self.name, self.kernel, self.choices.len())
    }
}

impl<S: Copy> Knob<S> {
    /// The knob of kernel `K`'s tiles at `field` of `S`, checked against `args` (addresses 0).
    pub fn kernel<K>(name: &'static str, field: fn(&mut S) -> &mut K::Tiles, args: K::Args) -> Knob<S>
    where
        K: KernelDef,
        K::Args: Copy + Send + Sync,
        S: 'static,
    {
        let tiles = move |s: &S| {
            let mut s = *s;
            *field(&mut s)
        };
        Knob {
            name,
            kernel: K::NAME,
            choices: tile_choices::<K::Tiles>().iter().map(tiles_string).collect(),
            chosen_in_step: K::Tiles::CHOSEN_IN_STEP,
            get: Box::new(move |s| tiles_string(&tiles(s))),
            set: Box::new(move |s, text| {
                match tile_choices::<K::Tiles>().into_iter().find(|t| tiles_string(t) == text) {
                    Some(t) => {
                        *field(s) = t;
                        true
                    }
                    None => false,
                }
            }),
            fits: Box::new(move |s| K::launch_dims(&tiles(s), &args).map(|_| ()).map_err(|e| e.to_string())),
            specialize: Box::new(move |s, arch| Some(K::specialize(&tiles(s), arch).map_err(|e| e.message))),
            version: Box::new(kernel_version::<K>),
        }
    }

    /// The current setting of this knob in `s`.
    pub fn get(&self, s: &S) -> String {
        (self.get)(s)
    }

    /// Sets the knob; false when `text` is none of its choices.
    pub fn set(&self, s: &mut S, text: &str) -> bool {
        (self.set)(s, text)
    }

    /// Whether this knob's launch takes the unit's shape at `s`.
    pub fn fits(&self, s: &S) -> std::result::Result<(), String> {
        (self.fits)(s)
    }

    /// The kernel at `s`'s setting of this knob (None for a grid setting).
    pub fn specialize(&self, s: &S, arch: Arch) -> Option<std::result::Result<Kernel, String>> {
        (self.specialize)(s, arch)
    }

    pub fn version(&self, arch: Arch) -> String {
        (self.version)(arch)
    }
}

/// A family in one format at one shape, and its knobs.
pub struct Unit<S> {
    pub family: &'static str,
    pub format: &'static str,
    pub shape: String,
    pub knobs: Vec<Knob<S>>,
    /// The family's whole check of its tiles at the shape.
    valid: Boxed<Checker<S>>,
}

impl<S> std::fmt::Debug for Unit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unit({} {} at {}: {:?})", self.family, self.format, self.shape, self.knobs)
    }
}

fn fmt_name(nvfp4: bool) -> &'static str {
    if nvfp4 { "nvfp4" } else { "bf16" }
}

impl<S: Copy + 'static> Unit<S> {
    pub fn valid(&self, s: &S) -> std::result::Result<(), String> {
        (self.valid)(s)
    }

    /// The winner's choices for `s`, with each knob's current version.
    pub fn choices(&self, s: &S, arch: Arch) -> Vec<Choice> {
        self.knobs
            .iter()
            .map(|k| Choice { knob: k.name.into(), kernel: k.kernel.into(), version: k.version(arch), tiles: k.get(s) })
            .collect()
    }

    /// `tiles` with this unit's entry of `table` applied, or why the entry is not taken.
    pub fn apply(&self, table: &Table, arch: Arch, tiles: S) -> std::result::Result<S, String> {
        let what = format!("{} {}", self.family, self.format);
        let e = table.entry(self.family, self.format, &self.shape).ok_or_else(|| format!("{what}: no entry"))?;
        let mut t = tiles;
        for k in &self.knobs {
            let c = e
                .winner
                .iter()
                .find(|c| c.knob == k.name)
                .ok_or_else(|| format!("{what}: stale entry: it has no `{}` ({} now)", k.name, k.kernel))?;
            if c.kernel != k.kernel {
                return Err(format!(
                    "{what}: stale entry: its `{}` is {}'s, the step runs {}",
                    k.name, c.kernel, k.kernel
                ));
            }
            let now = k.version(arch);
            if c.version != now {
                return Err(format!(
                    "{what}: stale entry for {} (version {} in the table, {now} now)",
                    k.kernel, c.version
                ));
            }
            if !k.set(&mut t, &c.tiles) {
                return Err(format!("{what}: {} has no tile set `{}`", k.kernel, c.tiles));
            }
        }
        self.valid(&t).map_err(|e| format!("{what}: the tuned tiles do not fit: {e}"))?;
        Ok(t)
    }
}

/// MoE in one format: the router and that format's gate/up and down.
pub fn moe_unit(shape: MoeShape, nvfp4: bool) -> Unit<MoeTiles> {
    let a = MoeLaunches::unbound(shape, nvfp4);
    let mut knobs = vec![Knob::kernel::<moe_router::Kernel>("router", |t: &mut MoeTiles| &mut t.router, a.router)];
    match (a.gate_up, a.down) {
        (moe::GateUp::Nvfp4(g), moe::Down::Nvfp4(d)) => {
            knobs.push(Knob::kernel::<moe_gate_up_nvfp4::Kernel>("gate_up", |t| &mut t.gate_up_nvfp4, g));
            knobs.push(Knob::kernel::<moe_down_nvfp4::Kernel>("down", |t| &mut t.down_nvfp4, d));
        }
        (moe::GateUp::Bf16(g), moe::Down::Bf16(d)) => {
            knobs.push(Knob::kernel::<moe_gate_up_bf16::Kernel>("gate_up", |t| &mut t.gate_up_bf16, g));
            knobs.push(Knob::kernel::<moe_down_bf16::Kernel>("down", |t| &mut t.down_bf16, d));
        }
        _ => unreachable!("unbound makes the format it is asked for"),
    }
    Unit {
        family: "moe",
        format: fmt_name(nvfp4),
        shape: format!("{shape:?}"),
        knobs,
        valid: Box::new(move |t: &MoeTiles| t.check(shape).map_err(|e| e.to_string())),
    }
}

/// The Gated Residual in one format, at the sites' shape (the final mixer's checked too).
pub fn mix_unit(shape: MixShape, final_shape: MixShape, nvfp4: bool) -> Unit<MixTiles> {
    let knobs = match MixLaunches::unbound(shape, nvfp4) {
        MixLaunches { down: mix::Down::Nvfp4(d), up: mix::Up::Nvfp4(u) } => vec![
            Knob::kernel::<mix_down_nvfp4::Kernel>("down", |t: &mut MixTiles| &mut t.down_nvfp4, d),
            Knob::kernel::<mix_up_nvfp4::Kernel>("up", |t| &mut t.up_nvfp4, u),
        ],
        MixLaunches { down: mix::Down::Bf16(d), up: mix::Up::Bf16(u) } => vec![
            Knob::kernel::<mix_down_bf16::Kernel>("down", |t: &mut MixTiles| &mut t.down_bf16, d),
            Knob::kernel::<mix_up_bf16::Kernel>("up", |t| &mut t.up_bf16, u),
        ],
        _ => unreachable!("unbound makes the format it is asked for"),
    };
    Unit {
        family: "mix",
        format: fmt_name(nvfp4),
        shape: format!("{shape:?}"),
        knobs,
        valid: Box::new(move |t: &MixTiles| {
            t.check(shape).and_then(|()| t.check(final_shape)).map_err(|e| e.to_string())
        }),
    }
}

/// The GDN layer on the step's path (the norm in the delta rule's whole-head blocks): the input
/// projection of its format, the state update, out_proj's GEMV of its format ([`gemv_nvfp4`] on
/// `out_proj_nvfp4` for NVFP4 weights, as the step runs it). The format names both matrices'
/// formats ([`gdn_format`]), so an entry tuned with the other out_proj kernel is not taken.
pub fn gdn_unit(shape: GdnShape, nvfp4_in_proj: bool, nvfp4_out_proj: bool) -> Unit<GdnTiles> {
    let a = GdnLaunches::unbound(shape, nvfp4_in_proj);
    let mut knobs = vec![match a.in_proj {
        InProj::Bf16(args) => {
            Knob::kernel::<gdn_in_proj_bf16::Kernel>("in_proj", |t: &mut GdnTiles| &mut t.in_proj, args)
        }
        InProj::Nvfp4(args) => {
            Knob::kernel::<gdn_in_proj_nvfp4::Kernel>("in_proj", |t: &mut GdnTiles| &mut t.in_proj_nvfp4, args)
        }
    }];
    knobs.push(Knob::kernel::<gdn_delta_rule_normed::Kernel>(
        "delta_rule_normed",
        |t| &mut t.delta_rule_normed,
        a.delta_rule_normed,
    ));
    knobs.push(if nvfp4_out_proj {
        Knob::kernel::<gemv_nvfp4::Kernel>("out_proj", |t| &mut t.out_proj_nvfp4, a.out_proj_nvfp4)
    } else {
        Knob::kernel::<gemv_bf16::Kernel>("out_proj", |t| &mut t.out_proj, a.out_proj)
    });
    Unit {
        family: "gdn",
        format: gdn_format(nvfp4_in_proj, nvfp4_out_proj),
        shape: format!("{shape:?}"),
        knobs,
        valid: Box::new(move |t: &GdnTiles| {
            t.check(shape, nvfp4_in_proj).map_err(|e| e.to_string())?;
            if nvfp4_out_proj {
                t.check_out_proj_nvfp4(shape).map_err(|e| e.to_string())?;
            }
            Ok(())
        }),
    }
}

/// The GDN unit's format: `nvfp4` (both matrices, as [`crate::step::Formats::NVFP4`] has them),
/// `bf16`, or which one alone is NVFP4 (`nvfp4 in_proj`, `nvfp4 out_proj`). Tables written
/// before out_proj ran in NVFP4 keyed `nvfp4` by the input projection alone: their `gdn nvfp4`
/// entries name `gemv_bf16` for out_proj, and [`Unit::apply`] reports them stale.
pub fn gdn_format(nvfp4_in_proj: bool, nvfp4_out_proj: bool) -> &'static str {
    two_part_format(nvfp4_in_proj, nvfp4_out_proj, "nvfp4 in_proj", "nvfp4 out_proj")
}

/// The format name of a unit whose two parts each are NVFP4 or bf16: `nvfp4` or `bf16` where they
/// agree, else the name of the one alone in NVFP4.
fn two_part_format(a: bool, b: bool, only_a: &'static str, only_b: &'static str) -> &'static str {
    match (a, b) {
        (true, true) => "nvfp4",
        (false, false) => "bf16",
        (true, false) => only_a,
        (false, true) => only_b,
    }
}

/// The one-block top-k's tiles inside QSA tiles (a unit of the one-block kernel only ever holds
/// that variant: [`qsa_unit`]'s check refuses the other).
fn one_block_top_k(t: &mut QsaTiles) -> &mut qsa_top_blocks::Tiles {
    if let TopK::Grid(_) = t.top_k {
        t.top_k = TopK::OneBlock(TileSet::DEFAULT);
    }
    match &mut t.top_k {
        TopK::OneBlock(tiles) => tiles,
        TopK::Grid(_) => unreachable!("set to the one-block variant just above"),
    }
}

/// The multi-block top-k's tiles inside QSA tiles, as [`one_block_top_k`].
fn grid_top_k(t: &mut QsaTiles) -> &mut qsa_top_blocks_grid::Tiles {
    if let TopK::OneBlock(_) = t.top_k {
        t.top_k = TopK::Grid(TileSet::DEFAULT);
    }
    match &mut t.top_k {
        TopK::Grid(tiles) => tiles,
        TopK::OneBlock(_) => unreachable!("set to the grid variant just above"),
    }
}

/// The QSA layer with caches of `capacity` tokens, its projections in bf16 or NVFP4 (as the
/// plan's [`crate::step::Formats::qsa`] says): the stacked projection ([`gemv_bf16`], or
/// [`gemv_nvfp4`] on `in_proj_nvfp4`), prepare, the block scores, the top-k kernel the plan chose
/// for the capacity (`grid`: the multi-block one), the attention, its combine, o_proj (the GEMV of
/// the format, on `o_proj` or `o_proj_nvfp4`). The shape key names the top-k kernel, not the
/// capacity: one entry serves every context that runs the same kernel, and the check at the plan's
/// capacity decides whether it fits.
pub fn qsa_unit(shape: QsaShape, capacity: usize, grid: bool, nvfp4: bool) -> Unit<QsaTiles> {
    let a = QsaLaunches::unbound(shape, capacity, QsaTiles::fitting(shape).attention);
    let top_k = if grid {
        Knob::kernel::<qsa_top_blocks_grid::Kernel>("top_k", grid_top_k, a.top_blocks_grid)
    } else {
        Knob::kernel::<qsa_top_blocks::Kernel>("top_k", one_block_top_k, a.top_blocks)
    };
    let (in_proj, o_proj) = if nvfp4 {
        (
            Knob::kernel::<gemv_nvfp4::Kernel>("in_proj", |t: &mut QsaTiles| &mut t.in_proj_nvfp4, a.in_proj_nvfp4),
            Knob::kernel::<gemv_nvfp4::Kernel>("o_proj", |t: &mut QsaTiles| &mut t.o_proj_nvfp4, a.o_proj_nvfp4),
        )
    } else {
        (
            Knob::kernel::<gemv_bf16::Kernel>("in_proj", |t: &mut QsaTiles| &mut t.in_proj, a.in_proj),
            Knob::kernel::<gemv_bf16::Kernel>("o_proj", |t: &mut QsaTiles| &mut t.o_proj, a.o_proj),
        )
    };
    let knobs = vec![
        in_proj,
        Knob::kernel::<qsa_prepare::Kernel>("prepare", |t| &mut t.prepare, a.prepare),
        Knob::kernel::<qsa_block_scores::Kernel>("block_scores", |t| &mut t.block_scores, a.block_scores),
        top_k,
        Knob::kernel::<qsa_attention::Kernel>("attention", |t| &mut t.attention, a.attention),
        Knob::kernel::<qsa_attention_combine::Kernel>("combine", |t| &mut t.combine, a.combine),
        o_proj,
    ];
    Unit {
        family: "qsa",
        format: fmt_name(nvfp4),
        shape: format!("{shape:?} top_k={}", if grid { "grid" } else { "one_block" }),
        knobs,
        valid: Box::new(move |t: &QsaTiles| {
            if matches!(t.top_k, TopK::Grid(_)) != grid {
                return Err(format!(
                    "the plan runs the {} top-k at {capacity} tokens",
                    if grid { "multi-block" } else { "one-block" }
                ));
            }
            t.check(shape, capacity).map_err(|e| e.to_string())?;
            if nvfp4 {
                t.check_nvfp4(shape).map_err(|e| e.to_string())?;
            }
            Ok(())
        }),
    }
}

/// The format name of a PLE unit: `nvfp4` or `bf16` where its table rows and its projections
/// agree, else which one alone is NVFP4 (`nvfp4 rows`, `nvfp4 proj`). Tables written before the
/// projections ran in NVFP4 keyed `nvfp4` by the rows alone: their `ple nvfp4` entries name
/// `gemv_bf16` for the projections, and [`Unit::apply`] reports them stale.
pub fn ple_format(rows: RowFormat, nvfp4_proj: bool) -> &'static str {
    two_part_format(rows == RowFormat::Nvfp4, nvfp4_proj, "nvfp4 rows", "nvfp4 proj")
}

/// The PLE block of one PLE layer with its table's rows in `format` and its projections in NVFP4
/// where `nvfp4_proj`: the format's gather (from host memory), the stacked key and value
/// projections' GEMV, the gate and conv. The ids kernel has no tiles to tune.
pub fn ple_unit(shape: PleShape, format: RowFormat, nvfp4_proj: bool) -> Unit<PleTiles> {
    let a = PleLaunches::unbound(shape, format);
    let gather = match a.gather {
        Gather::Bf16(g) => Knob::kernel::<ple_gather_bf16::Kernel>("gather", |t: &mut PleTiles| &mut t.gather, g),
        Gather::Nvfp4(g) => {
            Knob::kernel::<ple_gather_nvfp4::Kernel>("gather", |t: &mut PleTiles| &mut t.gather_nvfp4, g)
        }
    };
    let proj = if nvfp4_proj {
        Knob::kernel::<gemv_nvfp4::Kernel>("proj", |t: &mut PleTiles| &mut t.proj_nvfp4, a.proj_nvfp4)
    } else {
        Knob::kernel::<gemv_bf16::Kernel>("proj", |t: &mut PleTiles| &mut t.proj, a.proj)
    };
    Unit {
        family: "ple",
        format: ple_format(format, nvfp4_proj),
        shape: format!("{shape:?}"),
        knobs: vec![
            gather,
            proj,
            Knob::kernel::<ple_gate_conv::Kernel>("gate_conv", |t| &mut t.gate_conv, a.gate_conv),
        ],
        valid: Box::new(move |t: &PleTiles| {
            t.check(shape, format).map_err(|e| e.to_string())?;
            if nvfp4_proj {
                t.check_nvfp4(shape).map_err(|e| e.to_string())?;
            }
            Ok(())
        }),
    }
}

/// The lm_head's waves (blocks per SM) to try.
pub const LM_HEAD_WAVES: [u32; 4] = [8, 4, 12, 16];

/// The lm_head in one format: the kernel's tiles, and the waves of its grid on `sms` SMs.
pub fn lm_head_unit(vocab: usize, hidden: usize, sms: u32, nvfp4: bool) -> Unit<LmHeadTiles> {
    let (v, h) = (vocab as u32, hidden as u32);
    let bf16_args = move |blocks: u32| lm_head_argmax_bf16::Args {
        w: DevPtr::NULL,
        x: DevPtr::NULL,
        logits: DevPtrMut::NULL,
        best_key: DevPtrMut::NULL,
        best_row: DevPtrMut::NULL,
        counter: DevPtrMut::NULL,
        token: DevPtrMut::NULL,
        vocab: v,
        hidden: h,
        blocks,
    };
    let nvfp4_args = move |blocks: u32| lm_head_argmax_nvfp4::Args {
        packed: DevPtr::NULL,
        scales: DevPtr::NULL,
        scale2: DevPtr::NULL,
        x: DevPtr::NULL,
        logits: DevPtrMut::NULL,
        best_key: DevPtrMut::NULL,
        best_row: DevPtrMut::NULL,
        counter: DevPtrMut::NULL,
        token: DevPtrMut::NULL,
        vocab: v,
        hidden: h,
        blocks,
    };
    let blocks = move |waves: u32| (sms * waves.max(1)).min(65_535);
    let d = LmHeadTiles::default();
    let kernel_knob = if nvfp4 {
        Knob::kernel::<lm_head_argmax_nvfp4::Kernel>(
            "tiles",
            |t: &mut LmHeadTiles| &mut t.nvfp4,
            nvfp4_args(blocks(d.waves)),
        )
    } else {
        Knob::kernel::<lm_head_argmax_bf16::Kernel>(
            "tiles",
            |t: &mut LmHeadTiles| &mut t.bf16,
            bf16_args(blocks(d.waves)),
        )
    };
    let valid = move |t: &LmHeadTiles| -> std::result::Result<(), String> {
        let b = blocks(t.waves);
        let r = if nvfp4 {
            lm_head_argmax_nvfp4::Kernel::launch_dims(&t.nvfp4, &nvfp4_args(b))
        } else {
            lm_head_argmax_bf16::Kernel::launch_dims(&t.bf16, &bf16_args(b))
        };
        r.map(|_| ()).map_err(|e| e.to_string())
    };
    let waves_knob = Knob {
        name: "waves",
        kernel: "grid",
        choices: LM_HEAD_WAVES.iter().map(u32::to_string).collect(),
        chosen_in_step: &[],
        get: Box::new(|t: &LmHeadTiles| t.waves.to_string()),
        set: Box::new(|t, text| match text.parse::<u32>() {
            Ok(w) if LM_HEAD_WAVES.contains(&w) => {
                t.waves = w;
                true
            }
            _ => false,
        }),
        fits: Box::new(valid),
        specialize: Box::new(|_, _| None),
        version: Box::new(|_| "grid".to_owned()),
    };
    Unit {
        family: "lm_head",
        format: fmt_name(nvfp4),
        shape: format!("LmHead {{ vocab: {vocab}, hidden: {hidden} }}"),
        knobs: vec![kernel_knob, waves_knob],
        valid: Box::new(valid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(device_slug("NVIDIA H200"), "nvidia-h200");
        assert_eq!(device_slug("NVIDIA GB10 (x)"), "nvidia-gb10-x");
    }

    #[test]
    fn versions_are_stable_and_per_kernel() {
        let a = kernel_version::<moe_router::Kernel>(Arch::Sm90);
        assert_eq!(a, kernel_version::<moe_router::Kernel>(Arch::Sm90));
        assert_ne!(a, kernel_version::<moe_down_nvfp4::Kernel>(Arch::Sm90));
        assert_ne!(a, kernel_version::<moe_router::Kernel>(Arch::Sm121a));
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn knobs_round_trip_their_choices() {
        let shape =
            MoeShape { hidden: 2560, experts: 512, top_k: 10, inter: 640, shared_inter: 640, renormalise: true };
        let u = moe_unit(shape, true);
        let mut t = MoeTiles::default();
        for k in &u.knobs {
            assert_eq!(k.get(&t), k.choices[0], "{} starts at its default", k.name);
            for c in &k.choices {
                assert!(k.set(&mut t, c), "{}: {c}", k.name);
                assert_eq!(&k.get(&t), c);
            }
            assert!(!k.set(&mut t, "NOPE=1"));
        }
    }
}

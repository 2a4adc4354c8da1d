//! Snapshot tests of the CUDA emitter: small `#[kernel]` examples, each showing one feature of
//! `kernel_dsl::emit::cuda` (prelude choice per architecture, constant folding, control flow,
//! precedence, names, the raw escape hatch, line wrapping), plus a few property checks.
//!
//! Review a changed snapshot as a CUDA engineer would read the file, then accept it with
//! `cargo insta review` (or `INSTA_UPDATE=always cargo test --test emit_snapshots`).

use kernel_dsl::{Arch, KernelDef, TileSet, emit};
use kernel_macros::kernel;

/// The emitted CUDA of kernel `K` at `tiles` for `arch`.
fn cuda<K: KernelDef>(tiles: &K::Tiles, arch: Arch) -> String {
    emit::cuda(&K::specialize(tiles, arch).expect("the example kernel specialises"))
}

/// The traced build of kernel `K` (`emit::trace`, what a GPU opened with `FLASHNEXT_TRACE=1`
/// loads).
fn traced<K: KernelDef>(tiles: &K::Tiles, arch: Arch) -> String {
    emit::trace::cuda_traced(&K::specialize(tiles, arch).expect("the example kernel specialises"))
}

/// The part of an emitted file after the prelude: the `__global__` function itself.
fn body(src: &str) -> &str {
    let at = src.find("extern \"C\" __global__").expect("a kernel entry point");
    &src[at..]
}

// ---- prelude: number formats and the architecture ----

/// Unpacks FP4 (e2m1) weights, sixteen per thread, and scales them.
#[kernel(block = 128, grid = div_ceil(n, 128 * 16))]
pub fn fp4_decode(w: &[e2m1x2], scale: f32, y: &mut [f32], n: u32) {
    let i = (block_idx() * block_dim() + thread_idx()) * 16;
    if i < n {
        let q = load_vec::<u32x2>(w, i / 2);
        let a = e2m1x4_to_f32x4(q.x);
        let b = e2m1x4_to_f32x4(q.x >> 16);
        let c = e2m1x4_to_f32x4(q.y);
        let d = e2m1x4_to_f32x4(q.y >> 16);
        store_vec(y, i, f32x4(a.x * scale, a.y * scale, a.z * scale, a.w * scale));
        store_vec(y, i + 4, f32x4(b.x * scale, b.y * scale, b.z * scale, b.w * scale));
        store_vec(y, i + 8, f32x4(c.x * scale, c.y * scale, c.z * scale, c.w * scale));
        store_vec(y, i + 12, f32x4(d.x * scale, d.y * scale, d.z * scale, d.w * scale));
    }
}

/// FP8 (e4m3) values, eight per thread, with one e4m3 scale per 32 values.
#[kernel(block = 64, grid = div_ceil(n, 64 * 8))]
pub fn fp8_decode(q: &[e4m3], scales: &[e4m3], y: &mut [f32], n: u32) {
    let i = (block_idx() * block_dim() + thread_idx()) * 8;
    if i >= n {
        return;
    }
    let s = scales[i / 32] as f32;
    let v = load_vec::<u32x2>(q, i);
    let lo = e4m3x4_to_f32x4(v.x);
    let hi = e4m3x4_to_f32x4(v.y);
    store_vec(y, i, f32x4(lo.x * s, lo.y * s, lo.z * s, lo.w * s));
    store_vec(y, i + 4, f32x4(hi.x * s, hi.y * s, hi.z * s, hi.w * s));
}

/// Conversions: bf16 and f16 to and from f32, and between integer widths and f32.
#[kernel(block = 256, grid = div_ceil(n, 256))]
pub fn casts(xb: &[bf16], xh: &[f16], yb: &mut [bf16], yh: &mut [f16], idx: &mut [i32], n: u32) {
    let i = block_idx() * 256 + thread_idx();
    if i < n {
        let a = xb[i] as f32;
        let b = xh[i] as f32;
        yb[i] = (a * b + 1.0) as bf16;
        yh[i] = (a - b) as f16;
        let k = (a * 16.0) as i32 - 3;
        let wide = i as u64 * 4096 + k as u64;
        idx[i] = (wide >> 12) as i32 + (b as i32) * k;
    }
}

// Regression: a lane of `load_vec` (`load_vec::<u32x2>(x, 0).x`) needs the load in parentheses,
// `(*reinterpret_cast<const uint2*>(x)).x`; C would read the bare form as `*(... .x)`.
/// Dot products of bf16 rows with a bf16 vector: 16-byte steps, then 8-byte steps for the tail.
#[kernel(block = 32, grid = rows)]
pub fn dots(w: &[bf16], x: &[bf16], y: &mut [bf16], packed: &mut [u32], rows: u32, cols: u32) {
    let row = block_idx();
    let main = cols - cols % 256;
    let mut acc = 0.0;
    for k in (lane_id() * 8..main).step_by(256) {
        acc += dot_bf16x8(load_stream::<u32x4>(w, row * cols + k), load_vec::<u32x4>(x, k));
    }
    for k in (main + lane_id() * 4..cols).step_by(128) {
        acc += dot_bf16x4(load_stream::<u32x2>(w, row * cols + k), load_vec::<u32x2>(x, k));
    }
    let total = warp_sum(acc);
    if lane_id() == 0 {
        y[row] = total as bf16;
        let p = bf16x2_to_f32x2(load_vec::<u32x2>(x, 0).x);
        packed[row] = pack_bf16x2(p.x * total, p.y * total);
    }
}

// ---- collectives and memory ----

/// Sum and maximum of a group: block and warp reductions (f32, and u32 in one instruction), and
/// the three shuffles.
#[kernel(block = 32 * WARPS, grid = groups)]
pub fn reductions(
    #[tile(default = 4, candidates = [4, 8])] WARPS: u32,
    x: &[f32],
    y: &mut [f32],
    groups: u32,
    len: u32,
) {
    let scratch = shared::<f32, WARPS>();
    let base = block_idx() * len;
    let mut s = 0.0;
    let mut m = f32::NEG_INFINITY;
    for i in (thread_idx()..len).step_by(block_dim()) {
        let v = x[base + i];
        s += v;
        m = m.max(v);
    }
    let total = block_sum(s, scratch);
    let peak = block_max(m, scratch);
    let lane_total = warp_sum(s);
    let lane_peak = warp_max(m);
    let down = shfl_down(lane_total, 1);
    let across = shfl_xor(lane_peak, 16);
    let first = shfl(s, 0);
    let widest = warp_max_u32(thread_idx() * 7 % 32);
    let narrowest = warp_min_u32(widest - lane_id());
    sync_threads();
    if thread_idx() == 0 {
        y[block_idx()] = total / peak + down - across + first + (widest + narrowest) as f32;
    }
}

/// Every memory intrinsic: streaming, vector, L2 and acquire loads, vector stores, atomics (u64
/// too), a fence;
/// vector constructors and lanes, read and written.
#[kernel(block = 128, grid = div_ceil(n, 512))]
pub fn memory(
    w: &[u32],
    src: &[f32],
    dst: &mut [f32],
    partial: &mut [f32],
    counters: &mut [u32],
    hist: &mut [i32],
    wide: &mut [u64],
    n: u32,
) {
    let tile = shared::<u32, 512>();
    let wide_tile = shared::<u64, 128>();
    let t = thread_idx();
    let i = block_idx() * 512 + t * 4;
    let words = load_stream::<u32x4>(w, i);
    let pair = load_stream::<u32x2>(w, i + 2);
    let f = load_vec::<f32x4>(src, i);
    store_vec(tile, t * 4, u32x4(words.w, words.z, words.y ^ pair.x, words.x | pair.y));
    // Zeroed before the atomics below add into it (specialisation refuses a shared array that
    // only atomics touch: they would add into what the last block left there).
    wide_tile[t] = 0;
    sync_threads();
    let mut back = load_vec::<u32x4>(tile, (t * 4 + 4) % 512);
    back.y = back.x + 1;
    store_vec(dst, i, f32x4(f.x * 2.0, f.y * 2.0, f.z + f.w, -f.w));
    store_vec(partial, i, f32x2(f.x, f.y));
    let seen = load_cg(partial, block_idx());
    let count = load_cg(counters, 0);
    let old = atomic_add(counters, block_idx(), back.y);
    atomic_add(hist, t, -1);
    atomic_add(tile, t, 1);
    let sum = load_cg(wide, 0);
    atomic_add(wide, 1, sum + 1);
    atomic_add(wide_tile, t, sum);
    thread_fence();
    let released = load_acquire(counters, 1);
    partial[i] = seen + count as f32 + old as f32 + released as f32;
}

/// f32 math, min and max of each arithmetic type, bit reinterpretation.
#[kernel(block = 32, grid = 1)]
pub fn math(x: &[f32], a: u32, b: i32, y: &mut [f32], bits: &mut [u32]) {
    let v = x[thread_idx()];
    let e = exp(v) + ln(v.abs()) + sqrt(v * v) + v.rsqrt() + tanh(v);
    let act = sigmoid(v) + silu(v) + softplus(v);
    let m = v.max(0.0).min(6.0) + max(v, e) + min(act, 1.0);
    let um = max(a, thread_idx()) + min(a, 7);
    let im = max(b, -1) * min(b, 3);
    y[thread_idx()] = fma(e, act, m) + v.mul_add(2.0, 1.0) + f32::from_bits(um) + f32_from_bits(im as u32);
    bits[thread_idx()] = (v * 0.5).to_bits();
}

// ---- constant folding ----

/// Tiles and the architecture fold away: the dead branch of a bool tile, `x * ONE + 0`, an empty
/// loop, `sm()` comparisons, `block_dim()`.
#[kernel(block = 64, grid = div_ceil(n, 64))]
pub fn fold(
    #[tile(default = false)] SPLIT: bool,
    #[tile(default = 1, candidates = [1, 2])] ONE: u32,
    #[tile(default = 0, candidates = [0, 1])] ZERO: u32,
    x: &[f32],
    y: &mut [f32],
    partial: &mut [f32],
    n: u32,
) {
    let i = block_idx() * block_dim() * ONE + thread_idx() + ZERO;
    let j = i * ONE + 0;
    if i >= n {
        return;
    }
    let v = x[j];
    if SPLIT {
        partial[i] = v;
    } else {
        y[i] = v * 2.0;
    }
    let scale = if SPLIT { 0.5 } else { 2.0 };
    if sm() >= 100 {
        y[i] = v * scale + 1.0;
    } else if sm() == 90 {
        y[i] = v * scale - 1.0;
    } else {
        y[i] = 0.0;
    }
    for k in 0..ZERO {
        y[k] = 0.0;
    }
    while ZERO > 0 {
        y[0] = 1.0;
    }
    if !SPLIT && j % (ONE * 2) == 0 || false {
        y[j] += 1.0;
    }
}

// ---- control flow ----

// Regression: the last loop's end `m` is a mutable variable the body grows; Rust evaluates `0..m`
// once, so the emitted loop computes its end once too (`__k_end`).
/// for with step_by and #[unroll], #[unroll(n)], #[unroll(TILE)], while, loop with break and
/// continue, if / else if / else, if as a value, early return.
#[kernel(block = 32, grid = 1)]
pub fn control_flow(
    #[tile(default = 4, candidates = [2, 4])] UNROLL: u32,
    x: &[f32],
    y: &mut [f32],
    n: u32,
    limit: i32,
) {
    let lane = lane_id();
    if lane >= n {
        return;
    }
    let mut acc = 0.0;
    #[unroll]
    for k in (0..16).step_by(4) {
        acc += x[lane + k];
    }
    #[unroll(2)]
    for k in (lane..n).step_by(32) {
        acc += x[k];
    }
    #[unroll(UNROLL)]
    for k in 0..n {
        if k == lane {
            continue;
        }
        acc -= x[k] * 0.5;
    }
    let mut j: i32 = 0;
    while j < limit {
        j += 3;
        if j % 7 == 0 {
            break;
        }
    }
    let mut tries = 0;
    loop {
        tries += 1;
        if acc > 100.0 {
            acc *= 0.5;
            continue;
        }
        if tries >= 8 {
            break;
        }
        acc += 1.0;
    }
    let class = if acc < 0.0 {
        0
    } else if acc < 1.0 {
        1
    } else {
        2
    };
    if class == 0 {
        y[lane] = -acc;
    } else if class == 1 {
        y[lane] = acc;
    } else if j > 5 {
        y[lane] = acc * 2.0;
    } else {
        y[lane] = 0.0;
    }
    // Rust evaluates a range's end once, before the first iteration.
    let mut m = n;
    for k in 0..m {
        m += 1;
        y[k] += 1.0;
    }
}

/// Strided loops with a run-time end, emitted with their trip count first (unsigned loops): the
/// start, end and step that can change while the loop runs (a mutable variable, a load) are kept
/// from the start, in Rust's order (start, end, step); break and continue inside; a signed loop
/// keeps the plain form.
#[kernel(block = 32, grid = 1)]
pub fn counted_loops(x: &[f32], bounds: &[u32], y: &mut [f32], n: u32, lo: i32, hi: i32) {
    let mut first = lane_id();
    let mut stride = 32;
    let mut acc = 0.0;
    #[unroll(4)]
    for k in (first..bounds[0]).step_by(stride) {
        if k >= n {
            break;
        }
        if x[k] < 0.0 {
            continue;
        }
        acc += x[k];
        first += 1;
        stride += 1;
    }
    for i in (lo..hi).step_by(4) {
        acc += i as f32;
    }
    y[lane_id()] = acc;
}

// ---- expressions ----

// Regression: `big` folds to i64::MIN, which must print as `(-9223372036854775807ll - 1)`: the literal
// 9223372036854775808ll does not fit a long long, so `-9223372036854775808ll` would be unsigned in C.
/// C precedence: shifts, bit operations, comparisons, logic, negative literals, casts.
#[kernel(block = 32, grid = 1)]
pub fn precedence(
    a: u32,
    b: u32,
    c: u32,
    s: i32,
    f: f32,
    flag: bool,
    out: &mut [u32],
    outi: &mut [i64],
    outf: &mut [f32],
) {
    let shifts = (a << 3) + (b >> 1) - (c << (a & 7));
    let mixed = a & b | c ^ a;
    let masked = a & 0xff == 0;
    let cmp = (a < b) == (c > 4);
    let logic = flag && a > b || !flag && (b >= c || c != 0);
    let neg = -s - -3 + -(-s) + i32::MIN;
    let negf = -f * -2.5 - -(f) + f32::MIN;
    let cast_arith = (a as f32) * f + (s as f32) / 2.0 - (a + b) as f32;
    let cast_int = (f * 255.0) as u32 >> 4;
    let not_bits = !a & (b | !c);
    let sub_chain = a - (b - c) - (a - b);
    let div_chain = a / (b / 3) * (c % 5);
    let unary_not = !(a > b);
    let bool_bits = flag & (a > b) | !flag ^ cmp;
    let wide = (a as u64) << 40 | 1u64 << 33;
    let big = -9223372036854775807i64 - 1;
    out[0] = shifts + mixed + not_bits + sub_chain + div_chain + wide as u32;
    out[1] = if masked && cmp || logic != unary_not || bool_bits { neg as u32 } else { (-neg) as u32 };
    outi[0] = big + (s as i64) * -2;
    outf[0] = negf + cast_arith + cast_int as f32 + (-(a as i32)) as f32;
}

/// Names: shadowed lets are numbered, C keywords and helper names get a trailing underscore,
/// tuple lets become one let each.
#[kernel(block = 32, grid = 1)]
pub fn names(int: u32, x: &[f32], float: &mut [f32]) {
    let acc = x[thread_idx()];
    let acc = acc * 2.0;
    let acc = acc + 1.0;
    let unsigned = int * 2;
    let auto = unsigned + 1;
    let warp_sum = acc + 0.5;
    let (lo, hi) = (int & 0xffff, int >> 16);
    let (sum, diff) = (lo + hi, lo - hi);
    for i in 0..4 {
        let acc = acc + i as f32;
        float[i * 32 + thread_idx()] = acc * warp_sum;
    }
    for i in 0..2 {
        float[128 + i] = (sum + diff + auto) as f32;
    }
}

// Regressions: the renamed parameter `float` -> `float_` and a local `float_` get distinct names; `let i`
// in the loop body does not redeclare the loop variable; the fill is evaluated once, outside the fill
// loop, whose counter cannot hide a local; the tuple let that swaps reads the old values.
/// Corners of naming where a Rust name meets an emitted one: a local named like a renamed keyword,
/// a `let` in a loop shadowing the loop variable, a local named like the fill loop's counter, and a
/// tuple let that swaps.
#[kernel(block = 32, grid = 1)]
pub fn name_collisions(x: &[f32], float: &mut [f32]) {
    let float_ = x[0];
    float[0] = float_;
    for i in 0..4 {
        let i = i * 2;
        float[i + 1] = 1.0;
    }
    let i_ = x[1];
    let fill = [i_; 4];
    float[8] = fill[3];
    let (a, b) = (x[2], x[3]);
    let (a, b) = (b, a);
    float[9] = a - b;
}

// ---- the escape hatch ----

/// raw_cuda with arguments: each argument substituted in parentheses, possibly several times.
#[kernel(block = 32, grid = 1)]
pub fn raw(x: &[u32], y: &mut [u32], ns: u32) {
    let v = x[thread_idx()];
    let bits = raw_cuda::<u32>("__popc({0})", v);
    let rotated = raw_cuda::<u32>("__funnelshift_l({0}, {0}, {1})", v, thread_idx() & 31);
    let twice = raw_cuda::<u32>("{0} * {0} + {1}", v + 1, bits);
    raw_cuda::<()>("__nanosleep({0})", ns);
    let f = raw_cuda::<f32>("__int_as_float({0})", v as i32);
    y[thread_idx()] = bits + rotated + twice + f as u32;
}

// Regression: a raw statement is emitted as written, not wrapped in parentheses (`(asm volatile(...));`
// is not C++).
/// raw_cuda for an instruction with no value: inline PTX.
#[kernel(block = 32, grid = 1)]
pub fn raw_asm(y: &mut [u32]) {
    y[thread_idx()] = 1;
    raw_cuda::<()>("asm volatile(\"membar.cta;\" ::: \"memory\")");
}

// ---- layout ----

/// Long calls are broken one argument per line; other long lines stay whole.
#[kernel(block = 32, grid = 1)]
pub fn long_lines(
    first_input_vector: &[f32],
    second_input_vector: &[f32],
    output_words: &mut [u32],
    output_values: &mut [f32],
    element_count: u32,
) {
    let t = thread_idx();
    let packed_result_vector = u32x4(
        pack_bf16x2(first_input_vector[t] * 0.5, second_input_vector[t] * 0.25),
        pack_bf16x2(first_input_vector[t + 1] * 0.5, second_input_vector[t + 1] * 0.25),
        pack_bf16x2(first_input_vector[t + 2] * 0.5, second_input_vector[t + 2] * 0.25),
        pack_bf16x2(first_input_vector[t + 3] * 0.5, second_input_vector[t + 3] * 0.25),
    );
    store_vec(output_words, t * 4, packed_result_vector);
    let mut accumulated = first_input_vector[t].mul_add(second_input_vector[t], first_input_vector[t + 1]);
    accumulated = fma(
        first_input_vector[t + element_count],
        second_input_vector[t + element_count],
        accumulated * first_input_vector[t + element_count + 1],
    );
    output_values[t] = accumulated * first_input_vector[t + 2] + second_input_vector[t + 3] * first_input_vector[t + 4]
        - second_input_vector[t + 5];
    store_vec(
        output_values,
        t * 4 + 128,
        f32x4(
            first_input_vector[t] * accumulated,
            second_input_vector[t] * accumulated,
            first_input_vector[t + 1],
            0.0,
        ),
    );
}

/// A kernel that overlaps its predecessor (programmatic dependent launch): it prefetches its
/// weights into L2 and reads them before waiting, and touches the predecessor's output after.
#[kernel(block = 128, grid = div_ceil(n, 128))]
pub fn overlap(w: &[u32], x: &[f32], y: &mut [f32], started: &mut [u64], n: u32) {
    let i = block_idx() * 128 + thread_idx();
    if thread_idx() == 0 {
        prefetch_l2(w, block_idx() * 128, 512);
        started[block_idx()] = global_timer();
    }
    let weight = if i < n { w[i] } else { 0 };
    grid_dependency_wait();
    launch_dependents();
    if i < n {
        y[i] = x[i] * weight as f32;
    }
}

/// A batch of weight loads issued before the grid dependency wait (`load_early`, coherent loads
/// that ptxas keeps before the wait) and a residency bound (`min_blocks`, the second argument of
/// `__launch_bounds__`), as the NVFP4 kernels that stream a batch before using it declare them.
#[kernel(block = 32 * WARPS, grid = div_ceil(n, 32 * WARPS), min_blocks = MIN_BLOCKS)]
pub fn early_batch(
    #[tile(default = 2, candidates = [2, 4])] WARPS: u32,
    #[tile(default = 4, candidates = [0, 4])] MIN_BLOCKS: u32,
    w: &[u32x4],
    half: &[u32x2],
    x: &[f32],
    y: &mut [f32],
    n: u32,
) {
    let i = block_idx() * 32 * WARPS + thread_idx();
    let row = min(i, n - 1);
    let mut batch = [u32x4(0, 0, 0, 0); 2];
    #[unroll]
    for j in 0..2 {
        batch[j] = load_early::<u32x4>(w, 2 * row + j);
    }
    let tail = load_early::<u32x2>(half, row);
    grid_dependency_wait();
    launch_dependents();
    if i < n {
        y[i] = x[i] * (batch[0].x + batch[1].w + tail.y) as f32;
    }
}

/// A kernel whose blocks wait for each other at a software grid barrier, declared `cooperative`:
/// every launch of it is a cooperative one (the driver makes all blocks resident at once or
/// refuses the launch), and its emitted file says so.
#[kernel(block = 128, grid = BLOCKS, require(BLOCKS <= 128), cooperative)]
pub fn grid_barrier(
    #[tile(default = 64, candidates = [32, 64])] BLOCKS: u32,
    x: &[u32],
    counter: &mut [u32],
    y: &mut [u32],
    n: u32,
) {
    grid_dependency_wait();
    let i = block_idx() * 128 + thread_idx();
    sync_threads();
    if thread_idx() == 0 {
        thread_fence();
        let arrived = atomic_add(counter, 0, 1);
        let goal = arrived - arrived % BLOCKS + BLOCKS;
        while load_acquire(counter, 0) - goal >= 0x80000000 {}
    }
    sync_threads();
    if i < n {
        y[i] = x[i] + 1;
    }
}

/// Rows streamed into shared memory by the copy engine: one thread per warp sets up the warp's
/// mbarrier slot, announces and issues two bulk copies and arrives; every lane waits for the
/// slot's first phase, then reads the rows where they landed.
#[kernel(block = 64, grid = div_ceil(n, 64), require(n % 4 == 0))]
pub fn bulk_rows(w: &[u32x4], scales: &[u8], y: &mut [u32], n: u32) {
    let rows = shared::<u32x4, 64>();
    let row_scales = shared::<u32, 16>();
    let landed = shared::<u64, 2>();
    let first = block_idx() * 64 + warp_id() * 32;
    if lane_id() == 0 {
        bulk_barrier_init(landed, warp_id(), 1);
    }
    sync_warp();
    if lane_id() == 0 {
        bulk_load(rows, warp_id() * 32, w, first, 512, landed, warp_id());
        bulk_load(row_scales, warp_id() * 8, scales, first, 32, landed, warp_id());
        bulk_barrier_arrive(landed, warp_id());
    }
    bulk_barrier_wait(landed, warp_id(), 0);
    let i = first + lane_id();
    if i < n {
        let v = load_vec::<u32x4>(rows, thread_idx());
        y[i] = v.x + (row_scales[thread_idx() / 4] >> (8 * (lane_id() % 4))) % 256;
    }
}

/// Device functions from two helpers files (`tests/dsl/helpers.rs`, `half.rs`), expanded in place: the
/// helpers' `acc` and `total` take numbered names beside the kernel's own, the buffer and the
/// shared array are used by their names, `warp_total`'s value lands in the kernel's `total`, and
/// `half(total)` is `total * 0.5f` where it stands.
#[kernel(block = 32 * WARPS, grid = n, helpers = ["tests/dsl/helpers.rs", "tests/dsl/half.rs"])]
pub fn helpers(#[tile(default = 2, candidates = [1, 2])] WARPS: u32, x: &[f32], y: &mut [f32], n: u32) {
    let seen = shared::<u32, 1>();
    if thread_idx() == 0 {
        seen[0] = 0;
    }
    sync_threads();
    let acc = x[block_idx() * 32 * WARPS + thread_idx()];
    let total = warp_total(acc);
    add_scaled(y, seen, acc, 2.0, block_idx());
    sync_threads();
    if thread_idx() == 0 {
        y[n + block_idx()] = half(total) + seen[0] as f32;
    }
}

/// Every example, by snapshot name. Kernels without an architecture in the name are emitted for
/// sm_90; their text is the same for sm_121a except for the header line.
fn all_sources() -> Vec<(&'static str, String)> {
    let fold = |split: bool, arch: Arch| cuda::<fold::Kernel>(&fold::Tiles { split, one: 1, zero: 0 }, arch);
    vec![
        ("fp4_decode_sm_90", cuda::<fp4_decode::Kernel>(&fp4_decode::Tiles {}, Arch::Sm90)),
        ("fp4_decode_sm_121a", cuda::<fp4_decode::Kernel>(&fp4_decode::Tiles {}, Arch::Sm121a)),
        ("fp8_decode", cuda::<fp8_decode::Kernel>(&fp8_decode::Tiles {}, Arch::Sm90)),
        ("casts", cuda::<casts::Kernel>(&casts::Tiles {}, Arch::Sm90)),
        ("dots", cuda::<dots::Kernel>(&dots::Tiles {}, Arch::Sm90)),
        ("reductions", cuda::<reductions::Kernel>(&reductions::Tiles { warps: 8 }, Arch::Sm90)),
        ("memory", cuda::<memory::Kernel>(&memory::Tiles {}, Arch::Sm90)),
        ("math", cuda::<math::Kernel>(&math::Tiles {}, Arch::Sm90)),
        ("fold_split_false_sm_90", fold(false, Arch::Sm90)),
        ("fold_split_true_sm_121a", fold(true, Arch::Sm121a)),
        ("control_flow", cuda::<control_flow::Kernel>(&control_flow::Tiles { unroll: 2 }, Arch::Sm90)),
        ("counted_loops", cuda::<counted_loops::Kernel>(&counted_loops::Tiles {}, Arch::Sm90)),
        ("precedence", cuda::<precedence::Kernel>(&precedence::Tiles {}, Arch::Sm90)),
        ("names", cuda::<names::Kernel>(&names::Tiles {}, Arch::Sm90)),
        ("name_collisions", cuda::<name_collisions::Kernel>(&name_collisions::Tiles {}, Arch::Sm90)),
        ("raw", cuda::<raw::Kernel>(&raw::Tiles {}, Arch::Sm90)),
        ("raw_asm", cuda::<raw_asm::Kernel>(&raw_asm::Tiles {}, Arch::Sm90)),
        ("long_lines", cuda::<long_lines::Kernel>(&long_lines::Tiles {}, Arch::Sm90)),
        ("overlap", cuda::<overlap::Kernel>(&overlap::Tiles {}, Arch::Sm90)),
        ("overlap_traced", traced::<overlap::Kernel>(&overlap::Tiles {}, Arch::Sm90)),
        ("early_batch", cuda::<early_batch::Kernel>(&early_batch::Tiles::DEFAULT, Arch::Sm90)),
        ("grid_barrier", cuda::<grid_barrier::Kernel>(&grid_barrier::Tiles { blocks: 64 }, Arch::Sm90)),
        ("bulk_rows", cuda::<bulk_rows::Kernel>(&bulk_rows::Tiles {}, Arch::Sm90)),
        ("helpers", cuda::<helpers::Kernel>(&helpers::Tiles::DEFAULT, Arch::Sm90)),
    ]
}

fn source(name: &str) -> String {
    all_sources().into_iter().find(|(n, _)| *n == name).map(|(_, s)| s).expect("a known example")
}

// ---- snapshots ----

macro_rules! snapshot_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                insta::assert_snapshot!($name, source($name));
            }
        )*
    };
}

snapshot_tests! {
    fp4_decode_sm_90 => "fp4_decode_sm_90",
    fp4_decode_sm_121a => "fp4_decode_sm_121a",
    fp8_decode => "fp8_decode",
    casts => "casts",
    dots => "dots",
    reductions => "reductions",
    memory => "memory",
    math => "math",
    fold_split_false_sm_90 => "fold_split_false_sm_90",
    fold_split_true_sm_121a => "fold_split_true_sm_121a",
    control_flow => "control_flow",
    counted_loops => "counted_loops",
    precedence => "precedence",
    names => "names",
    name_collisions => "name_collisions",
    raw => "raw",
    raw_asm => "raw_asm",
    long_lines => "long_lines",
    overlap => "overlap",
    overlap_traced => "overlap_traced",
    early_batch => "early_batch",
    grid_barrier => "grid_barrier",
    bulk_rows => "bulk_rows",
    helpers => "helpers",
}

#[test]
fn every_example_has_a_snapshot_test() {
    // The list above and all_sources() name the same examples.
    let names: Vec<&str> = all_sources().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 24);
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "snapshot names are unique");
}

// ---- properties ----

#[test]
fn cooperative_reaches_the_launch_configuration() {
    use kernel_dsl::{DevPtr, DevPtrMut, LaunchDims, TileSet};
    let args = grid_barrier::Args {
        x: DevPtr::from_addr(0x1000),
        counter: DevPtrMut::from_addr(0x2000),
        y: DevPtrMut::from_addr(0x3000),
        n: 1000,
    };
    for blocks in [32, 64] {
        let dims = grid_barrier::Kernel::launch_dims(&grid_barrier::Tiles { blocks }, &args).expect("dims");
        assert_eq!(
            dims,
            LaunchDims { grid: [blocks, 1, 1], block: [128, 1, 1], dynamic_shared_bytes: 0, cooperative: true }
        );
    }
    assert!(grid_barrier::Kernel::template().cooperative);
    let spec = grid_barrier::Kernel::specialize(&grid_barrier::Tiles::DEFAULT, Arch::Sm121a).expect("specialises");
    assert!(spec.cooperative && spec.waits_on_grid_dependency(), "cooperative and overlapped together");
    assert!(source("grid_barrier").contains("// Launched cooperatively"));

    // A kernel without the word is launched as before.
    let dims = overlap::Kernel::launch_dims(
        &overlap::Tiles {},
        &overlap::Args {
            w: DevPtr::from_addr(0x1000),
            x: DevPtr::from_addr(0x2000),
            y: DevPtrMut::from_addr(0x3000),
            started: DevPtrMut::from_addr(0x4000),
            n: 1000,
        },
    )
    .expect("dims");
    assert!(!dims.cooperative && !overlap::Kernel::template().cooperative);
    assert!(!source("overlap").contains("cooperatively"));
}

#[test]
fn min_blocks_becomes_the_second_launch_bound_and_bounds_the_tiles() {
    let bounded = source("early_batch");
    assert!(bounded.contains("__launch_bounds__(64, 4) early_batch("), "{bounded}");
    assert!(bounded.contains("4 blocks an SM at least"));
    let free = cuda::<early_batch::Kernel>(&early_batch::Tiles { warps: 2, min_blocks: 0 }, Arch::Sm90);
    assert!(free.contains("__launch_bounds__(64) early_batch("), "{free}");
    assert_eq!(early_batch::Tiles { warps: 4, min_blocks: 4 }.min_blocks(), 4);
    // 12 blocks of 256 threads exceed what an SM holds on sm_121a (1536 threads): refused.
    let too_many = overlap_bound::Tiles { min_blocks: 12 };
    let err = too_many.check().expect_err("12 blocks of 256 threads do not fit");
    assert!(err.message.contains("1536 threads"), "{}", err.message);
    assert!(overlap_bound::Tiles { min_blocks: 6 }.check().is_ok());
    assert_eq!(overlap_bound::Tiles::candidates().len(), 1, "the candidate over the bound is left out");
    // The coherent early loads, not the read-only path (which ptxas moves past the wait).
    assert!(
        bounded.contains("ld.global.L1::no_allocate.v4.u32") && bounded.contains("ld.global.L1::no_allocate.v2.u32")
    );
    assert!(!bounded.contains("ld.global.nc"));
}

#[test]
fn max_blocks_is_a_launch_property_checked_against_min_blocks() {
    let one = spread::Tiles { min_blocks: 0, max_blocks: 1 };
    let free = spread::Tiles { min_blocks: 0, max_blocks: 0 };
    assert_eq!((one.max_blocks(), free.max_blocks()), (1, 0));
    // A kernel that does not declare it has no bound.
    assert_eq!(overlap_bound::Tiles { min_blocks: 6 }.max_blocks(), 0);
    // Nothing of it is compiled: the CUDA differs only in the tiles' comment line.
    let body = |t: &spread::Tiles| {
        cuda::<spread::Kernel>(t, Arch::Sm90)
            .lines()
            .filter(|l| !l.starts_with("// Tiles:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(body(&one), body(&free));
    // At most 1 block an SM while compiled for 2 is a contradiction, refused and left out.
    let err = spread::Tiles { min_blocks: 2, max_blocks: 1 }.check().expect_err("max below min");
    assert!(
        err.message.contains("at most 1 blocks an SM") && err.message.contains("compiled for 2"),
        "{}",
        err.message
    );
    assert!(spread::Tiles { min_blocks: 2, max_blocks: 0 }.check().is_ok(), "0 is no bound");
    assert!(spread::Tiles { min_blocks: 1, max_blocks: 1 }.check().is_ok());
    let candidates = spread::Tiles::candidates();
    assert_eq!(candidates.len(), 3, "{candidates:?}");
    assert!(!candidates.contains(&spread::Tiles { min_blocks: 2, max_blocks: 1 }));
}

/// `#[tile(..., step)]` marks a tile that only the whole step can time; the mark is metadata
/// for the autotuner (`TileSet::CHOSEN_IN_STEP`), not code.
#[test]
fn a_step_mark_names_its_tiles_and_compiles_nothing() {
    assert_eq!(spread::Tiles::CHOSEN_IN_STEP, ["MAX_BLOCKS"]);
    assert!(overlap_bound::Tiles::CHOSEN_IN_STEP.is_empty(), "unmarked tiles: none");
    // The same kernel unmarked emits the same CUDA, name aside.
    let t = spread::Tiles { min_blocks: 2, max_blocks: 0 };
    let u = spread_unmarked::Tiles { min_blocks: 2, max_blocks: 0 };
    let marked = cuda::<spread::Kernel>(&t, Arch::Sm90);
    let unmarked = cuda::<spread_unmarked::Kernel>(&u, Arch::Sm90);
    assert_eq!(marked, unmarked.replace("spread_unmarked", "spread"));
}

#[kernel(block = 128, grid = n, min_blocks = MIN_BLOCKS, max_blocks = MAX_BLOCKS)]
fn spread_unmarked(
    #[tile(default = 0, candidates = [0, 2])] MIN_BLOCKS: u32,
    #[tile(default = 1, candidates = [0, 1])] MAX_BLOCKS: u32,
    y: &mut [f32],
    n: u32,
) {
    y[block_idx()] = 1.0;
}

#[kernel(block = 128, grid = n, min_blocks = MIN_BLOCKS, max_blocks = MAX_BLOCKS)]
fn spread(
    #[tile(default = 0, candidates = [0, 2])] MIN_BLOCKS: u32,
    #[tile(default = 1, candidates = [0, 1], step)] MAX_BLOCKS: u32,
    y: &mut [f32],
    n: u32,
) {
    y[block_idx()] = 1.0;
}

#[kernel(block = 256, grid = n, min_blocks = MIN_BLOCKS)]
fn overlap_bound(#[tile(default = 6, candidates = [6, 12])] MIN_BLOCKS: u32, y: &mut [f32], n: u32) {
    y[block_idx()] = 1.0;
}

#[test]
fn the_traced_build_runs_the_plain_body_between_its_stamps() {
    let plain = source("overlap");
    let traced = source("overlap_traced");
    // The plain entry point's statements, verbatim, are the traced body function's.
    let statements = |src: &str, from: &str| {
        let at = src.find(from).expect("the function");
        let open = at + src[at..].find("\n{\n").expect("its body") + 3;
        let close = open + src[open..].find("\n}\n").expect("its end");
        src[open..close].to_string()
    };
    assert_eq!(
        statements(&plain, "extern \"C\" __global__"),
        statements(&traced, "static __device__ __forceinline__ void overlap_body(")
    );
    // The entry point stamps, calls the body with its own parameters, waits for the block and
    // stamps again, into the launch's words and the block's record (at the block's linear index);
    // the wait stamps both.
    let entry = body(&traced);
    assert!(entry.contains("unsigned long long* flashnext_trace,\n    unsigned long long* flashnext_trace_blocks)"));
    assert!(entry.contains(
        "trace_block() = flashnext_trace_blocks ? flashnext_trace_blocks + 4ull * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) : nullptr;"
    ));
    let order = [
        "atomicMin(flashnext_trace, t)",
        "if (trace_block()) {\n            trace_block()[0] = t;",
        "trace_block()[3] = sm;",
        "overlap_body(w, x, y, started, n);",
        "__syncthreads();",
        "atomicMax(flashnext_trace + 3, t)",
        "if (trace_block()) trace_block()[2] = t;",
    ];
    let at: Vec<usize> = order.iter().map(|s| entry.find(s).unwrap_or_else(|| panic!("{s} in the entry"))).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "stamp, body, barrier, stamp: {at:?}");
    assert!(traced.contains("atomicMin(trace_words() + 2, t);\n        if (trace_block()) trace_block()[1] = t;"));
    // One timer, the prelude's, ahead of the stamps' helpers.
    assert_eq!(traced.matches("%%globaltimer").count(), 1);
    assert!(traced.find("global_timer()").unwrap() < traced.find("trace_leader()").unwrap());
    assert!(!plain.contains("trace_"), "the plain build has no stamp");
}

#[test]
fn fp4_decode_uses_the_conversion_instruction_only_where_it_exists() {
    let sm90 = source("fp4_decode_sm_90");
    assert!(!sm90.contains("cvt.rn.f16x2.e2m1x2"), "sm_90 has no FP4 conversion");
    // The software decode puts bits in place and leaves its values short by 2^126 (the raw
    // gap); the exact helper multiplies the gap back.
    assert!(sm90.contains("e2m1_raw_gap() { return __uint_as_float(0x7e800000u); }"));
    assert!(sm90.contains("(g03 * 0x10400000u) & keep"));
    let sm121a = source("fp4_decode_sm_121a");
    assert!(sm121a.contains("cvt.rn.f16x2.e2m1x2"));
    assert!(sm121a.contains("e2m1_raw_gap() { return 1.0f; }"), "the conversion is exact: no gap");
    assert!(!sm121a.contains("& keep"), "the software decode is sm_90's alone");
    // Both read the same packed type and produce the same helpers.
    for src in [&sm90, &sm121a] {
        assert!(src.contains("struct fp4x2_e2m1 { unsigned char bits; };"));
        assert!(src.contains("__device__ __forceinline__ float4 e2m1x4_to_float4_raw(unsigned w)"));
        assert!(src.contains("__device__ __forceinline__ float4 e2m1x4_to_float4(unsigned w)"));
    }
}

#[test]
fn a_bool_tile_keeps_only_its_branch() {
    let off = source("fold_split_false_sm_90");
    let on = source("fold_split_true_sm_121a");
    assert!(!body(&off).contains("partial["), "SPLIT=false never writes the partials");
    assert!(body(&off).contains("y[i] = v * 2.0f;"));
    assert!(body(&on).contains("partial[i] = v;"));
    assert!(!body(&on).contains("y[i] = v * 2.0f;"), "SPLIT=true never writes y directly");
    for src in [&off, &on] {
        let b = body(src);
        for gone in ["SPLIT", "ONE", "ZERO", "sm()", "__CUDA_ARCH__", "blockDim", "while", "for (", "|| false"] {
            assert!(!b.contains(gone), "`{gone}` should have folded away:\n{b}");
        }
        assert!(!b.contains(" * 1u") && !b.contains(" + 0u"), "identities fold:\n{b}");
        assert!(!b.contains(" ? "), "a select on a tile folds:\n{b}");
    }
    // sm() picks the branch per architecture.
    assert!(body(&off).contains("y[i] = v * scale - 1.0f;") && !body(&off).contains("v * scale + 1.0f"));
    assert!(body(&on).contains("y[i] = v * scale + 1.0f;") && !body(&on).contains("v * scale - 1.0f"));
}

#[test]
fn every_file_has_exactly_one_entry_point() {
    for (name, src) in all_sources() {
        assert_eq!(src.matches("extern \"C\" __global__").count(), 1, "{name}");
        assert_eq!(src.matches("__launch_bounds__(").count(), 1, "{name}");
        assert!(src.ends_with("}\n"), "{name}");
        assert!(!src.contains("#include"), "{name}: the file stands alone");
    }
}

#[test]
fn only_the_helpers_in_use_are_included() {
    let precedence = source("precedence");
    assert!(!precedence.contains("__device__"), "no helper is needed:\n{precedence}");
    let casts = source("casts");
    for h in ["bf16_to_f32(bf16 v)", "f32_to_bf16(float v)", "f16_to_f32(f16 v)", "f32_to_f16(float v)"] {
        assert!(casts.contains(h), "{h}");
    }
    assert!(!casts.contains("warp_sum"));
    // Dependencies come first.
    let dots = source("dots");
    let def = |f: &str| dots.find(&format!(" {f}(")).unwrap_or_else(|| panic!("{f} is defined"));
    assert!(def("bf16x2_to_float2") < def("dot_bf16x4"));
    assert!(def("dot_bf16x4") < def("dot_bf16x8"));
    let reductions = source("reductions");
    let def = |f: &str| reductions.find(&format!(" {f}(")).unwrap_or_else(|| panic!("{f} is defined"));
    assert!(def("warp_sum") < def("block_sum") && def("warp_max") < def("block_max"));
}

#[test]
fn shadowed_and_reserved_names_are_renamed() {
    let names = source("names");
    let b = body(&names);
    for decl in [
        "const unsigned int_",
        "float* __restrict__ float_",
        "const float acc_1 = acc * 2.0f;",
        "const float acc_2 = acc_1 + 1.0f;",
        "const unsigned unsigned_ = int_ * 2u;",
        "const unsigned auto_ = unsigned_ + 1u;",
        "const float warp_sum_ = acc_2 + 0.5f;",
        "const unsigned lo = int_ & 0xffffu;",
        "const unsigned hi = int_ >> 16u;",
    ] {
        assert!(b.contains(decl), "`{decl}` in:\n{b}");
    }
}

#[test]
fn raw_cuda_arguments_are_parenthesised() {
    let raw = source("raw");
    assert!(body(&raw).contains("((v + 1u) * (v + 1u) + bits)"), "{raw}");
    assert!(body(&raw).contains("__nanosleep(ns);"), "{raw}");
}

/// Every example is valid CUDA for the architecture it was emitted for: NVRTC compiles it. (NVRTC
/// needs no GPU; the test command installs it where it is missing.)
#[test]
fn every_example_compiles_with_nvrtc() {
    engine::cuda::nvrtc::load().unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    for (name, src) in all_sources() {
        let arch = if src.lines().next().is_some_and(|l| l.contains("(sm_121a)")) { Arch::Sm121a } else { Arch::Sm90 };
        if let Err(e) = engine::cuda::nvrtc::compile(&src, name, arch) {
            failures.push(format!("{name} ({arch}): {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

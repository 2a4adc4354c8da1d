//! Specialisation: a template plus tile values and an architecture becomes a concrete kernel.
//!
//! Tile parameters, `sm()` and `block_dim()` become literals; constant expressions fold; branches
//! on constants keep only the taken side and loops that cannot run vanish. NVRTC would fold these
//! too, but folding here keeps the emitted CUDA free of dead code and lets array lengths and the
//! shared-memory budget be checked before anything is compiled.

use std::fmt;

use crate::arch::Arch;
use crate::intrinsic::Intrinsic;
use crate::ir::{BinOp, Expr, ExprKind, KernelTemplate, Lit, Param, Stmt, UnOp, Unroll};
use crate::key::{KernelKey, TileValue};
use crate::types::{Scalar, Space, Type};

/// A kernel ready to emit: every tile is a literal, every array length known.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub key: KernelKey,
    pub origin: String,
    pub doc: Vec<String>,
    pub params: Vec<Param>,
    pub body: Vec<Stmt>,
    /// Threads per block, fixed by the tiles; the emitter writes it as `__launch_bounds__`.
    pub block_threads: u32,
    /// Blocks that must fit on one SM together, `__launch_bounds__`'s second argument; 0 leaves
    /// the register budget to ptxas. Set from the tiles by `KernelDef::specialize`.
    pub min_blocks: u32,
    /// Bytes of `__shared__` arrays.
    pub static_shared_bytes: u32,
    /// Launched cooperatively (`#[kernel(..., cooperative)]`): every block resident at once.
    pub cooperative: bool,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// Whether the specialised body still calls `grid_dependency_wait()`: only such a kernel may
    /// be launched to overlap its predecessor, since it is the call that orders its reads after
    /// the predecessor's writes.
    pub fn waits_on_grid_dependency(&self) -> bool {
        let mut found = false;
        for stmt in &self.body {
            stmt.visit_exprs(&mut |e| {
                found |=
                    matches!(e.kind, crate::ir::ExprKind::Call(crate::intrinsic::Intrinsic::GridDependencyWait, _));
            });
        }
        found
    }

    /// Whether the specialised body lets its successor launch (`launch_dependents()`) before its
    /// own `grid_dependency_wait()`, in the order the statements are written, or without ever
    /// waiting. Correct either way; it decides how many grids are resident at once, and the
    /// early ones take SM room and DRAM time from the running one (the step's rule, measured on
    /// the H200: `engine::cuda::Kernel::launch`).
    pub fn triggers_before_its_wait(&self) -> bool {
        use crate::intrinsic::Intrinsic as I;
        use crate::ir::ExprKind::Call;
        let (mut waited, mut early) = (false, false);
        for stmt in &self.body {
            stmt.visit_exprs(&mut |e| match e.kind {
                Call(I::GridDependencyWait, _) => waited = true,
                Call(I::LaunchDependents, _) => early |= !waited,
                _ => {}
            });
        }
        early
    }
}

/// Why a template could not be specialised with the given values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecializeError {
    pub kernel: String,
    pub message: String,
}

impl fmt::Display for SpecializeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel `{}`: {}", self.kernel, self.message)
    }
}

impl std::error::Error for SpecializeError {}

/// Specialises `template` for `tiles` (every tile parameter, by name) on `arch`, launched with
/// `block_threads` threads per block.
pub fn specialize(
    template: &KernelTemplate,
    tiles: &[(&str, TileValue)],
    arch: Arch,
    block_threads: u32,
) -> Result<Kernel, SpecializeError> {
    let fail = |message: String| SpecializeError { kernel: template.name.clone(), message };
    let mut values = Vec::with_capacity(template.tiles.len());
    for tile in &template.tiles {
        let (_, value) = tiles
            .iter()
            .find(|(n, _)| *n == tile.name)
            .ok_or_else(|| fail(format!("no value for tile parameter `{}`", tile.name)))?;
        values.push((tile.name.clone(), *value));
    }
    if let Some((extra, _)) = tiles.iter().find(|(n, _)| !template.tiles.iter().any(|t| t.name == *n)) {
        return Err(fail(format!("`{extra}` is not a tile parameter of this kernel")));
    }
    if block_threads == 0 || block_threads > Arch::MAX_THREADS_PER_BLOCK || !block_threads.is_multiple_of(32) {
        return Err(fail(format!(
            "{block_threads} threads per block: a block is 32 to {} threads, whole warps",
            Arch::MAX_THREADS_PER_BLOCK
        )));
    }
    let folder = Folder { tiles: &values, arch, block_threads };
    let body = folder.block(&template.body);

    let mut static_shared_bytes = 0u32;
    let mut problem = None;
    for stmt in &body {
        stmt.visit(&mut |s| {
            if let Stmt::Array { name, elem, len, space, .. } = s {
                match len.as_u32() {
                    Some(0) | None => {
                        problem.get_or_insert(format!("the length of array `{name}` is not a positive constant"));
                    }
                    Some(n) if *space == Space::Shared => {
                        static_shared_bytes = static_shared_bytes.saturating_add(n.saturating_mul(elem.size_bytes()));
                    }
                    Some(_) => {}
                }
            }
        });
    }
    if let Some(p) = problem {
        return Err(fail(p));
    }
    if let Some(name) = crate::shared_use::read_but_never_written(&body) {
        return Err(fail(format!(
            "shared array `{name}` is read but nothing writes it at these tiles (a write folded away with its branch?)"
        )));
    }
    let limit = Arch::MAX_STATIC_SHARED_BYTES.min(arch.max_shared_bytes_per_block());
    if static_shared_bytes > limit {
        return Err(fail(format!(
            "{static_shared_bytes} bytes of shared arrays exceed the {limit} bytes {arch} allows"
        )));
    }
    Ok(Kernel {
        key: KernelKey::new(&template.name, values, arch),
        origin: template.origin.clone(),
        doc: template.doc.clone(),
        params: template.params.clone(),
        body,
        block_threads,
        min_blocks: 0,
        static_shared_bytes,
        cooperative: template.cooperative,
    })
}

struct Folder<'a> {
    tiles: &'a [(String, TileValue)],
    arch: Arch,
    block_threads: u32,
}

impl Folder<'_> {
    fn block(&self, stmts: &[Stmt]) -> Vec<Stmt> {
        let mut out = Vec::with_capacity(stmts.len());
        for s in stmts {
            self.stmt(s, &mut out);
        }
        out
    }

    fn stmt(&self, s: &Stmt, out: &mut Vec<Stmt>) {
        match s {
            Stmt::Let { name, ty, mutable, init } => {
                out.push(Stmt::Let { name: name.clone(), ty: *ty, mutable: *mutable, init: self.expr(init) })
            }
            Stmt::Array { name, elem, len, space, fill } => out.push(Stmt::Array {
                name: name.clone(),
                elem: *elem,
                len: self.expr(len),
                space: *space,
                fill: fill.as_ref().map(|f| self.expr(f)),
            }),
            Stmt::Assign { place, op, value } => {
                out.push(Stmt::Assign { place: self.expr(place), op: *op, value: self.expr(value) })
            }
            Stmt::If { cond, then, els } => {
                let cond = self.expr(cond);
                match cond.as_lit() {
                    Some(Lit::Bool(true)) => out.extend(self.block(then)),
                    Some(Lit::Bool(false)) => out.extend(self.block(els)),
                    _ => {
                        let (then, els) = (self.block(then), self.block(els));
                        // Nothing to do either way, and a condition without effects: no statement.
                        if !(then.is_empty() && els.is_empty() && !has_effect(&cond)) {
                            out.push(Stmt::If { cond, then, els })
                        }
                    }
                }
            }
            Stmt::For { var, ty, start, end, step, unroll, body } => {
                let (start, end, step) = (self.expr(start), self.expr(end), self.expr(step));
                if let (Some(Lit::Int(a)), Some(Lit::Int(b))) = (start.as_lit(), end.as_lit())
                    && a >= b
                {
                    return;
                }
                let unroll = match unroll {
                    Unroll::ByTile(name) => match self.tiles.iter().find(|(n, _)| n == name) {
                        Some((_, TileValue::U32(n))) => Unroll::By(*n),
                        _ => Unroll::None,
                    },
                    u => u.clone(),
                };
                let body = self.block(body);
                if !body.is_empty() || [&start, &end, &step].into_iter().any(has_effect) {
                    out.push(Stmt::For { var: var.clone(), ty: *ty, start, end, step, unroll, body })
                }
            }
            Stmt::While { cond, body } => {
                let cond = self.expr(cond);
                if cond.as_lit() != Some(Lit::Bool(false)) {
                    out.push(Stmt::While { cond, body: self.block(body) })
                }
            }
            Stmt::Expr(e) => out.push(Stmt::Expr(self.expr(e))),
            Stmt::Break | Stmt::Continue | Stmt::Return => out.push(s.clone()),
        }
    }

    fn expr(&self, e: &Expr) -> Expr {
        let ty = e.ty;
        let kind = match &e.kind {
            ExprKind::Tile(name) => {
                let value = self.tiles.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
                return match value {
                    Some(TileValue::U32(v)) => Expr::int(i128::from(v), Scalar::U32),
                    Some(TileValue::Bool(v)) => Expr::bool(v),
                    // Unreachable for templates made by #[kernel]: it checks tile names.
                    None => e.clone(),
                };
            }
            ExprKind::Call(Intrinsic::Sm, _) => return Expr::int(i128::from(self.arch.sm()), Scalar::U32),
            ExprKind::Call(Intrinsic::BlockDim, _) => return Expr::int(i128::from(self.block_threads), Scalar::U32),
            ExprKind::Lit(_) | ExprKind::Var(_) => return e.clone(),
            ExprKind::Unary(op, a) => {
                let a = self.expr(a);
                if let Some(v) = fold_unary(*op, &a) {
                    return v;
                }
                ExprKind::Unary(*op, Box::new(a))
            }
            ExprKind::Binary(op, a, b) => {
                let (a, b) = (self.expr(a), self.expr(b));
                if let Some(v) = fold_binary(*op, &a, &b, ty) {
                    return v;
                }
                ExprKind::Binary(*op, Box::new(a), Box::new(b))
            }
            ExprKind::Cast(a) => {
                let a = self.expr(a);
                if a.ty == ty {
                    return a;
                }
                if let Some(v) = fold_cast(&a, ty) {
                    return v;
                }
                ExprKind::Cast(Box::new(a))
            }
            ExprKind::Index(a, b) => ExprKind::Index(Box::new(self.expr(a)), Box::new(self.expr(b))),
            ExprKind::Lane(a, lane) => ExprKind::Lane(Box::new(self.expr(a)), *lane),
            ExprKind::Call(f, args) => ExprKind::Call(*f, args.iter().map(|a| self.expr(a)).collect()),
            ExprKind::Select(c, a, b) => {
                let c = self.expr(c);
                match c.as_lit() {
                    Some(Lit::Bool(true)) => return self.expr(a),
                    Some(Lit::Bool(false)) => return self.expr(b),
                    _ => ExprKind::Select(Box::new(c), Box::new(self.expr(a)), Box::new(self.expr(b))),
                }
            }
            ExprKind::Raw(text, args) => ExprKind::Raw(text.clone(), args.iter().map(|a| self.expr(a)).collect()),
        };
        Expr::new(kind, ty)
    }
}

/// Whether evaluating `e` does something beyond producing its value.
fn has_effect(e: &Expr) -> bool {
    let mut effect = false;
    e.visit(&mut |x| match &x.kind {
        ExprKind::Call(f, _) if f.has_effect() => effect = true,
        ExprKind::Raw(..) => effect = true,
        _ => {}
    });
    effect
}

/// Wraps an integer to the range of `ty`, as the machine does.
fn wrap(v: i128, ty: Scalar) -> Option<i128> {
    Some(match ty {
        Scalar::U32 => i128::from(v as u32),
        Scalar::I32 => i128::from(v as i32),
        Scalar::U64 => i128::from(v as u64),
        Scalar::I64 => i128::from(v as i64),
        _ => return None,
    })
}

fn bits(ty: Scalar) -> u32 {
    ty.size_bytes() * 8
}

fn fold_unary(op: UnOp, a: &Expr) -> Option<Expr> {
    let ty = a.ty;
    match (op, a.as_lit()?) {
        (UnOp::Not, Lit::Bool(v)) => Some(Expr::bool(!v)),
        (UnOp::Not, Lit::Int(v)) => Some(Expr::new(ExprKind::Lit(Lit::Int(wrap(!v, ty.scalar()?)?)), ty)),
        (UnOp::Neg, Lit::Int(v)) => Some(Expr::new(ExprKind::Lit(Lit::Int(wrap(-v, ty.scalar()?)?)), ty)),
        (UnOp::Neg, Lit::Float(v)) => Some(Expr::new(ExprKind::Lit(Lit::Float(-v)), ty)),
        _ => None,
    }
}

fn fold_binary(op: BinOp, a: &Expr, b: &Expr, ty: Type) -> Option<Expr> {
    let lit = |l: Lit| Expr::new(ExprKind::Lit(l), ty);
    match (a.as_lit(), b.as_lit()) {
        (Some(Lit::Int(x)), Some(Lit::Int(y))) => {
            let s = a.ty.scalar()?;
            let v = match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                BinOp::Div if y != 0 => x / y,
                BinOp::Rem if y != 0 => x % y,
                BinOp::BitAnd => x & y,
                BinOp::BitOr => x | y,
                BinOp::BitXor => x ^ y,
                BinOp::Shl if (0..i128::from(bits(s))).contains(&y) => x << y,
                BinOp::Shr if (0..i128::from(bits(s))).contains(&y) => x >> y,
                BinOp::Eq => return Some(Expr::bool(x == y)),
                BinOp::Ne => return Some(Expr::bool(x != y)),
                BinOp::Lt => return Some(Expr::bool(x < y)),
                BinOp::Le => return Some(Expr::bool(x <= y)),
                BinOp::Gt => return Some(Expr::bool(x > y)),
                BinOp::Ge => return Some(Expr::bool(x >= y)),
                _ => return None,
            };
            Some(lit(Lit::Int(wrap(v, s)?)))
        }
        (Some(Lit::Bool(x)), Some(Lit::Bool(y))) => match op {
            BinOp::And | BinOp::BitAnd => Some(Expr::bool(x && y)),
            BinOp::Or | BinOp::BitOr => Some(Expr::bool(x || y)),
            BinOp::BitXor | BinOp::Ne => Some(Expr::bool(x != y)),
            BinOp::Eq => Some(Expr::bool(x == y)),
            _ => None,
        },
        // `false && x`, `true || x` and friends: the other side is never needed (nor evaluated in C).
        (Some(Lit::Bool(x)), None) => match (op, x) {
            (BinOp::And, false) => Some(Expr::bool(false)),
            (BinOp::And, true) | (BinOp::Or, false) => Some(b.clone()),
            (BinOp::Or, true) => Some(Expr::bool(true)),
            _ => None,
        },
        (None, Some(Lit::Bool(y))) => match (op, y) {
            (BinOp::And, true) | (BinOp::Or, false) => Some(a.clone()),
            _ => None,
        },
        // Integer identities, which tile values of 1 and 0 make common: `x * 1`, `x + 0`, `x / 1`.
        (None, Some(Lit::Int(y))) if a.ty.is_int_like() => match (op, y) {
            (BinOp::Add | BinOp::Sub | BinOp::BitOr | BinOp::BitXor | BinOp::Shl | BinOp::Shr, 0)
            | (BinOp::Mul | BinOp::Div, 1) => Some(a.clone()),
            _ => None,
        },
        (Some(Lit::Int(x)), None) if b.ty.is_int_like() => match (op, x) {
            (BinOp::Add | BinOp::BitOr | BinOp::BitXor, 0) | (BinOp::Mul, 1) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn fold_cast(a: &Expr, to: Type) -> Option<Expr> {
    let to_s = to.scalar()?;
    let v = match a.as_lit()? {
        Lit::Int(v) if to_s.is_int() => Lit::Int(wrap(v, to_s)?),
        Lit::Int(v) if to_s == Scalar::F32 => Lit::Float(f64::from(v as f32)),
        Lit::Bool(b) if to_s.is_int() => Lit::Int(i128::from(b)),
        _ => return None,
    };
    Some(Expr::new(ExprKind::Lit(v), to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{TileParam, TileType};
    use crate::types::Elem;

    fn tile(name: &str) -> Expr {
        Expr::new(ExprKind::Tile(name.into()), Type::U32)
    }

    fn template(body: Vec<Stmt>) -> KernelTemplate {
        KernelTemplate {
            name: "k".into(),
            origin: "test.rs".into(),
            doc: vec![],
            tiles: vec![
                TileParam { name: "N".into(), ty: TileType::U32 },
                TileParam { name: "SPLIT".into(), ty: TileType::Bool },
            ],
            params: vec![],
            body,
            cooperative: false,
        }
    }

    fn tiles(n: u32, split: bool) -> [(&'static str, TileValue); 2] {
        [("N", TileValue::U32(n)), ("SPLIT", TileValue::Bool(split))]
    }

    #[test]
    fn tiles_fold_into_constants() {
        let x = Expr::var("x", Type::U32);
        let body = vec![Stmt::Let {
            name: "y".into(),
            ty: Type::U32,
            mutable: false,
            init: Expr::binary(
                BinOp::Add,
                Expr::binary(BinOp::Mul, x.clone(), tile("N"), Type::U32),
                Expr::binary(BinOp::Mul, tile("N"), Expr::u32(3), Type::U32),
                Type::U32,
            ),
        }];
        let k = specialize(&template(body), &tiles(1, false), Arch::Sm90, 128).expect("specialise");
        let Stmt::Let { init, .. } = &k.body[0] else { panic!("a let") };
        // x * 1 + 1 * 3  ->  x + 3
        assert_eq!(init, &Expr::binary(BinOp::Add, x, Expr::u32(3), Type::U32));
    }

    #[test]
    fn constant_branches_and_empty_loops_vanish() {
        let split = Expr::new(ExprKind::Tile("SPLIT".into()), Type::BOOL);
        let sync = Stmt::Expr(Expr::call(Intrinsic::SyncThreads, vec![], Type::Void));
        let body = vec![
            Stmt::If { cond: split, then: vec![Stmt::Return], els: vec![sync.clone()] },
            Stmt::For {
                var: "i".into(),
                ty: Scalar::U32,
                start: Expr::u32(0),
                end: Expr::binary(BinOp::Sub, tile("N"), Expr::u32(1), Type::U32),
                step: Expr::u32(1),
                unroll: Unroll::Full,
                body: vec![sync.clone()],
            },
        ];
        let k = specialize(&template(body), &tiles(1, false), Arch::Sm121a, 64).expect("specialise");
        assert_eq!(k.body, vec![sync]);
    }

    #[test]
    fn shared_memory_is_counted_and_bounded() {
        let shared = |len: Expr| Stmt::Array {
            name: "s".into(),
            elem: Elem::Scalar(Scalar::F32),
            len,
            space: Space::Shared,
            fill: None,
        };
        let k = specialize(&template(vec![shared(tile("N"))]), &tiles(256, true), Arch::Sm90, 256).expect("specialise");
        assert_eq!(k.static_shared_bytes, 1024);
        let err =
            specialize(&template(vec![shared(tile("N"))]), &tiles(20_000, true), Arch::Sm90, 256).expect_err("too big");
        assert!(err.message.contains("80000 bytes"), "{err}");
        let err = specialize(&template(vec![shared(Expr::var("n", Type::U32))]), &tiles(1, true), Arch::Sm90, 256)
            .expect_err("not constant");
        assert!(err.message.contains("not a positive constant"), "{err}");
    }

    #[test]
    fn every_tile_needs_a_value() {
        let err = specialize(&template(vec![]), &[("N", TileValue::U32(1))], Arch::Sm90, 32).expect_err("missing");
        assert!(err.to_string().contains("SPLIT"));
        let err = specialize(
            &template(vec![]),
            &[("N", TileValue::U32(1)), ("SPLIT", TileValue::Bool(true)), ("M", TileValue::U32(2))],
            Arch::Sm90,
            32,
        )
        .expect_err("extra");
        assert!(err.to_string().contains("`M`"));
        assert!(specialize(&template(vec![]), &tiles(1, true), Arch::Sm90, 48).is_err());
    }

    #[test]
    fn arithmetic_wraps_like_the_machine() {
        let e = fold_binary(BinOp::Sub, &Expr::u32(0), &Expr::u32(1), Type::U32).expect("folds");
        assert_eq!(e.as_u32(), Some(u32::MAX));
        assert!(fold_binary(BinOp::Div, &Expr::u32(1), &Expr::u32(0), Type::U32).is_none());
        assert!(fold_binary(BinOp::Shl, &Expr::u32(1), &Expr::u32(32), Type::U32).is_none());
    }
}

//! Which shared arrays a specialised body reads and which it writes: a kernel that reads a shared
//! array nothing writes reads whatever the last block on that SM left there, and no test on a CPU
//! sees it. Checked after the tiles fold, since a tile can fold away the only write (2026-11-30:
//! a refactor left `gdn_in_proj_nvfp4`'s default tiles reading its staged x from an array whose
//! staging had moved under the other tile value's branch; it compiled for both archs and failed
//! only on the GPU).

use std::collections::BTreeSet;

use crate::intrinsic::Intrinsic;
use crate::ir::{Expr, ExprKind, Stmt};
use crate::types::Space;

/// The first shared array (in declaration order) that `body` reads and never writes. Only a
/// store writes (`=`, `store_vec`, the block reductions' scratch, `nvfp4_mma_stage`): `+=` and
/// the atomics read what is there first, so an array they alone touch still counts as unwritten.
/// Order is not checked (a store after the read satisfies it), nor scopes (arrays by name).
pub fn read_but_never_written(body: &[Stmt]) -> Option<String> {
    let mut shared = Vec::new();
    for stmt in body {
        stmt.visit(&mut |s| {
            if let Stmt::Array { name, space: Space::Shared, .. } = s {
                shared.push(name.clone());
            }
        });
    }
    if shared.is_empty() {
        return None;
    }
    let mut uses = Uses::default();
    for stmt in body {
        uses.stmt(stmt);
    }
    shared.into_iter().find(|name| uses.read.contains(name) && !uses.written.contains(name))
}

#[derive(Default)]
struct Uses {
    read: BTreeSet<String>,
    written: BTreeSet<String>,
}

impl Uses {
    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Assign { place, op, value } => {
                // A plain store writes the place's base; `+=` and the like read it first, so they
                // only read. The place's index is an ordinary expression.
                let (base, rest) = place_parts(place);
                if let Some(name) = base {
                    if op.is_some() {
                        self.read.insert(name.to_owned());
                    } else {
                        self.written.insert(name.to_owned());
                    }
                }
                rest.into_iter().for_each(|e| self.expr(e));
                self.expr(value);
            }
            Stmt::If { cond, then, els } => {
                self.expr(cond);
                then.iter().chain(els).for_each(|s| self.stmt(s));
            }
            Stmt::For { start, end, step, body, .. } => {
                [start, end, step].into_iter().for_each(|e| self.expr(e));
                body.iter().for_each(|s| self.stmt(s));
            }
            Stmt::While { cond, body } => {
                self.expr(cond);
                body.iter().for_each(|s| self.stmt(s));
            }
            other => other.visit_exprs(&mut |e| self.leaf(e)),
        }
    }

    /// Every use inside `e`.
    fn expr(&mut self, e: &Expr) {
        e.visit(&mut |x| self.leaf(x));
    }

    /// One node's own use of an array (its children are visited separately).
    fn leaf(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Index(base, _) => {
                if let ExprKind::Var(name) = &base.kind {
                    self.read.insert(name.clone());
                }
            }
            ExprKind::Call(f, args) => {
                for (i, a) in args.iter().enumerate() {
                    if let ExprKind::Var(name) = &a.kind {
                        if writes_argument(*f, i) {
                            self.written.insert(name.clone());
                        } else {
                            self.read.insert(name.clone());
                        }
                    }
                }
            }
            // CUDA text with arguments: any array it is given may be written.
            ExprKind::Raw(_, args) => {
                for a in args {
                    if let ExprKind::Var(name) = &a.kind {
                        self.written.insert(name.clone());
                        self.read.insert(name.clone());
                    }
                }
            }
            _ => {}
        }
    }
}

/// An assignment's place: the array or pointer variable it stores into (None for a plain
/// variable or a vector lane of one), and the expressions it evaluates to find the element.
fn place_parts(place: &Expr) -> (Option<&str>, Vec<&Expr>) {
    match &place.kind {
        ExprKind::Index(base, index) => match &base.kind {
            ExprKind::Var(name) => (Some(name), vec![index]),
            _ => (None, vec![base, index]),
        },
        ExprKind::Lane(inner, _) => place_parts(inner),
        _ => (None, vec![]),
    }
}

/// Whether intrinsic `f` stores into its argument `i` (an array or a pointer) without reading it
/// first. The atomics read before they write (and return what they read), so they do not count.
fn writes_argument(f: Intrinsic, i: usize) -> bool {
    use Intrinsic as I;
    match f {
        I::StoreVec => i == 0,
        // The block reductions pass their partial sums through the scratch array they are given.
        I::BlockSum | I::BlockMax => i == 1,
        // nvfp4_mma_stage(v, xs, xsc, i, valid) writes the staged pairs and the scales.
        I::Nvfp4MmaStage => i == 1 || i == 2,
        // bulk_load(dst, d, src, s, bytes, bars, i) fills dst; bulk_barrier_init sets up its slots.
        I::BulkLoad | I::BulkBarrierInit => i == 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinOp, Expr};
    use crate::types::{Elem, Scalar, Type};

    fn shared(name: &str) -> Stmt {
        Stmt::Array {
            name: name.into(),
            elem: Elem::Scalar(Scalar::F32),
            len: Expr::u32(64),
            space: Space::Shared,
            fill: None,
        }
    }

    fn arr(name: &str) -> Expr {
        Expr::var(name, Type::Array { elem: Elem::Scalar(Scalar::F32), space: Space::Shared })
    }

    fn read(name: &str) -> Stmt {
        Stmt::Let { name: "v".into(), ty: Type::F32, mutable: false, init: Expr::index(arr(name), Expr::u32(0)) }
    }

    fn write(name: &str) -> Stmt {
        Stmt::Assign { place: Expr::index(arr(name), Expr::u32(0)), op: None, value: Expr::f32(1.0) }
    }

    #[test]
    fn a_read_needs_a_write_somewhere() {
        assert_eq!(read_but_never_written(&[shared("xs"), read("xs")]), Some("xs".into()));
        assert_eq!(read_but_never_written(&[shared("xs"), write("xs"), read("xs")]), None);
        // Declared and unused (a one-element array of the path not taken) is fine.
        assert_eq!(read_but_never_written(&[shared("xs")]), None);
        // A write inside a loop or a branch that stays after folding counts.
        let w = Stmt::If { cond: Expr::var("c", Type::BOOL), then: vec![write("xs")], els: vec![] };
        assert_eq!(read_but_never_written(&[shared("xs"), w, read("xs")]), None);
    }

    #[test]
    fn a_compound_assignment_or_an_atomic_reads_first() {
        let add =
            Stmt::Assign { place: Expr::index(arr("s"), Expr::u32(1)), op: Some(BinOp::Add), value: Expr::f32(2.0) };
        assert_eq!(read_but_never_written(&[shared("s"), add.clone()]), Some("s".into()));
        assert_eq!(read_but_never_written(&[shared("s"), write("s"), add]), None);
        let atomic =
            Stmt::Expr(Expr::call(Intrinsic::AtomicAdd, vec![arr("s"), Expr::u32(0), Expr::u32(1)], Type::U32));
        assert_eq!(read_but_never_written(&[shared("s"), atomic.clone()]), Some("s".into()));
        assert_eq!(read_but_never_written(&[shared("s"), write("s"), atomic]), None);
    }

    #[test]
    fn intrinsics_read_or_write_their_array_arguments() {
        let load = Stmt::Let {
            name: "v".into(),
            ty: Type::F32,
            mutable: false,
            init: Expr::call(Intrinsic::LoadVec(crate::types::Vector::F32x4), vec![arr("xs"), Expr::u32(0)], Type::F32),
        };
        assert_eq!(read_but_never_written(&[shared("xs"), load.clone()]), Some("xs".into()));
        let store = Stmt::Expr(Expr::call(
            Intrinsic::StoreVec,
            vec![arr("xs"), Expr::u32(0), Expr::var("v4", Type::F32)],
            Type::Void,
        ));
        assert_eq!(read_but_never_written(&[shared("xs"), store, load]), None);
        let sum = Stmt::Let {
            name: "t".into(),
            ty: Type::F32,
            mutable: false,
            init: Expr::call(Intrinsic::BlockSum, vec![Expr::var("v", Type::F32), arr("scratch")], Type::F32),
        };
        assert_eq!(read_but_never_written(&[shared("scratch"), sum]), None);
    }

    #[test]
    fn a_bulk_copy_fills_its_destination_and_an_init_its_barrier_slots() {
        let copy = |dst: &str, bars: &str| {
            let args = vec![
                arr(dst),
                Expr::u32(0),
                Expr::var("w", Type::Ptr { elem: Elem::Scalar(Scalar::U32), mutable: false }),
                Expr::u32(0),
                Expr::u32(512),
                arr(bars),
                Expr::u32(0),
            ];
            Stmt::Expr(Expr::call(Intrinsic::BulkLoad, args, Type::Void))
        };
        let init = Stmt::Expr(Expr::call(
            Intrinsic::BulkBarrierInit,
            vec![arr("landed"), Expr::u32(0), Expr::u32(1)],
            Type::Void,
        ));
        let wait = Stmt::Expr(Expr::call(
            Intrinsic::BulkBarrierWait,
            vec![arr("landed"), Expr::u32(0), Expr::u32(0)],
            Type::Void,
        ));
        let body = [shared("rows"), shared("landed"), init, copy("rows", "landed"), wait.clone(), read("rows")];
        assert_eq!(read_but_never_written(&body), None);
        // Rows read with no copy into them, or a slot waited on that nothing set up, are flagged.
        assert_eq!(read_but_never_written(&[shared("rows"), shared("landed"), read("rows")]), Some("rows".into()));
        let unset = [shared("rows"), shared("landed"), copy("rows", "landed"), wait, read("rows")];
        assert_eq!(read_but_never_written(&unset), Some("landed".into()));
    }
}

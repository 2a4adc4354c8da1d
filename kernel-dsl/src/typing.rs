//! The typing rules of kernel bodies, as Rust has them where the two languages meet: no implicit
//! conversions, literals take the type of what they meet, `as` for conversions.
//!
//! These are pure functions over [`Type`]s. `#[kernel]` applies them while it lowers a body, so a
//! mistake is reported at its Rust span when the crate compiles, not when a kernel is emitted.

use crate::ir::{BinOp, Expr, ExprKind, UnOp};
use crate::types::{Scalar, Type};

/// The one type two operands share, letting open literals adopt the other side's type.
pub fn unify(a: Type, b: Type) -> Option<Type> {
    match (a, b) {
        _ if a == b => Some(a),
        (Type::IntLit, Type::Scalar(s)) | (Type::Scalar(s), Type::IntLit) if s.is_arith_int() => Some(Type::Scalar(s)),
        (Type::FloatLit, Type::Scalar(Scalar::F32)) | (Type::Scalar(Scalar::F32), Type::FloatLit) => Some(Type::F32),
        _ => None,
    }
}

/// Types `lhs op rhs`: returns the operand type (both sides settle to it) and the result type.
pub fn binary(op: BinOp, lhs: Type, rhs: Type) -> Result<(Type, Type), String> {
    if op.is_shift() {
        // As in Rust, the shift amount may have any integer type; the result has the left side's.
        if !lhs.is_int_like() || !rhs.is_int_like() {
            return Err(format!("`{}` shifts integers, found {lhs} and {rhs}", op.symbol()));
        }
        return Ok((lhs, lhs));
    }
    let operand = unify(lhs, rhs).ok_or_else(|| mismatch(op, lhs, rhs))?;
    if op.is_logical() {
        return if operand == Type::BOOL {
            Ok((operand, Type::BOOL))
        } else {
            Err(format!("`{}` joins bool values, found {lhs} and {rhs}", op.symbol()))
        };
    }
    let arith = match operand {
        Type::IntLit | Type::FloatLit => true,
        Type::Scalar(s) => s.is_arith(),
        _ => false,
    };
    if op.is_comparison() {
        let comparable = arith || operand == Type::BOOL && matches!(op, BinOp::Eq | BinOp::Ne);
        return if comparable {
            Ok((operand, Type::BOOL))
        } else {
            Err(format!("`{}` compares numbers, found {operand}", op.symbol()))
        };
    }
    if op.is_bitwise() || op == BinOp::Rem {
        return if operand.is_int_like() || (op.is_bitwise() && operand == Type::BOOL) {
            Ok((operand, operand))
        } else {
            Err(format!("`{}` needs integers, found {operand}", op.symbol()))
        };
    }
    if arith {
        Ok((operand, operand))
    } else {
        Err(format!(
            "`{}` is not defined for {operand}: storage types take part in arithmetic only after `as f32`",
            op.symbol()
        ))
    }
}

fn mismatch(op: BinOp, lhs: Type, rhs: Type) -> String {
    let hint = match (lhs, rhs) {
        (Type::Scalar(a), Type::Scalar(b)) if a.is_arith() && b.is_arith() => {
            format!("; convert one side with `as {a}` or `as {b}`")
        }
        (Type::IntLit, Type::FloatLit | Type::Scalar(Scalar::F32))
        | (Type::FloatLit | Type::Scalar(Scalar::F32), Type::IntLit) => {
            "; write the integer literal as a float (`1.0`)".to_owned()
        }
        _ => String::new(),
    };
    format!("mismatched types in `{}`: {lhs} and {rhs}{hint}", op.symbol())
}

/// Types a unary operation.
pub fn unary(op: UnOp, arg: Type) -> Result<Type, String> {
    match op {
        UnOp::Neg => match arg {
            Type::IntLit | Type::FloatLit | Type::Scalar(Scalar::I32 | Scalar::I64 | Scalar::F32) => Ok(arg),
            _ => Err(format!("cannot negate a value of type {arg}")),
        },
        UnOp::Not => {
            if arg == Type::BOOL || arg.is_int_like() {
                Ok(arg)
            } else {
                Err(format!("`!` needs a bool or an integer, found {arg}"))
            }
        }
    }
}

/// Checks a conversion `from as to`.
pub fn cast(from: Type, to: Scalar) -> Result<(), String> {
    use Scalar as S;
    let from_scalar = match from {
        Type::IntLit => S::I64,
        Type::FloatLit => S::F32,
        Type::Scalar(s) => s,
        t => return Err(format!("cannot convert {t} with `as`")),
    };
    let ok = match (from_scalar, to) {
        (a, b) if a == b => true,
        // Every integer to every integer, and integers to and from f32.
        (a, b) if a.is_int() && (b.is_int() || b == S::F32) => true,
        (S::F32, b) if b.is_int() => true,
        (S::Bool, b) if b.is_int() => true,
        // The float encodings to f32, and f32 to bf16 and f16 (round to nearest even).
        (S::F32, S::Bf16 | S::F16) | (S::Bf16 | S::F16 | S::E4m3, S::F32) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else if from_scalar == S::E2m1x2 || to == S::E2m1x2 {
        Err("packed e2m1 values are decoded with `e2m1x4_to_f32x4`, not `as`".to_owned())
    } else {
        Err(format!("cannot convert {from_scalar} to {to} with `as`; go through f32"))
    }
}

/// Whether an integer literal's value fits in `ty`.
pub fn int_fits(value: i128, ty: Scalar) -> bool {
    match ty {
        Scalar::I32 => i32::try_from(value).is_ok(),
        Scalar::U32 => u32::try_from(value).is_ok(),
        Scalar::I64 => i64::try_from(value).is_ok(),
        Scalar::U64 => u64::try_from(value).is_ok(),
        Scalar::U8 => u8::try_from(value).is_ok(),
        Scalar::U16 => u16::try_from(value).is_ok(),
        Scalar::F32 => true,
        _ => false,
    }
}

/// Gives an expression whose type is an open literal type the concrete type `ty`, recursively.
/// Expressions of concrete types are left as they are.
pub fn settle(expr: &mut Expr, ty: Type) {
    if !expr.ty.is_open_literal() || ty.is_open_literal() {
        return;
    }
    expr.ty = ty;
    match &mut expr.kind {
        ExprKind::Unary(_, a) => settle(a, ty),
        ExprKind::Binary(op, a, b) => {
            if op.is_shift() {
                settle(a, ty);
                settle(b, Type::U32);
            } else {
                settle(a, ty);
                settle(b, ty);
            }
        }
        ExprKind::Select(_, a, b) => {
            settle(a, ty);
            settle(b, ty);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_adopt_the_other_side() {
        assert_eq!(binary(BinOp::Add, Type::IntLit, Type::U32), Ok((Type::U32, Type::U32)));
        assert_eq!(binary(BinOp::Mul, Type::F32, Type::FloatLit), Ok((Type::F32, Type::F32)));
        assert_eq!(binary(BinOp::Lt, Type::IntLit, Type::I32), Ok((Type::I32, Type::BOOL)));
        assert!(binary(BinOp::Add, Type::IntLit, Type::F32).is_err());
    }

    #[test]
    fn no_implicit_conversions() {
        let e = binary(BinOp::Add, Type::U32, Type::I32).expect_err("u32 + i32");
        assert!(e.contains("as u32"), "{e}");
        let bf16 = Type::Scalar(Scalar::Bf16);
        assert!(binary(BinOp::Mul, bf16, bf16).expect_err("bf16 * bf16").contains("as f32"));
    }

    #[test]
    fn shifts_keep_the_left_type() {
        assert_eq!(binary(BinOp::Shl, Type::U32, Type::IntLit), Ok((Type::U32, Type::U32)));
        assert_eq!(binary(BinOp::Shr, Type::U64, Type::U32), Ok((Type::U64, Type::U64)));
        assert!(binary(BinOp::Shl, Type::F32, Type::U32).is_err());
    }

    #[test]
    fn logic_and_bits() {
        assert_eq!(binary(BinOp::And, Type::BOOL, Type::BOOL), Ok((Type::BOOL, Type::BOOL)));
        assert!(binary(BinOp::And, Type::U32, Type::U32).is_err());
        assert!(binary(BinOp::BitAnd, Type::F32, Type::F32).is_err());
        assert!(binary(BinOp::Rem, Type::F32, Type::F32).is_err());
        assert_eq!(unary(UnOp::Not, Type::U32), Ok(Type::U32));
        assert!(unary(UnOp::Neg, Type::U32).is_err());
    }

    #[test]
    fn casts() {
        assert!(cast(Type::Scalar(Scalar::Bf16), Scalar::F32).is_ok());
        assert!(cast(Type::F32, Scalar::Bf16).is_ok());
        assert!(cast(Type::U32, Scalar::F32).is_ok());
        assert!(cast(Type::Scalar(Scalar::Bf16), Scalar::U32).expect_err("bf16 as u32").contains("through f32"));
        assert!(cast(Type::Scalar(Scalar::E2m1x2), Scalar::F32).expect_err("e2m1").contains("e2m1x4_to_f32x4"));
    }

    #[test]
    fn settle_reaches_nested_literals() {
        let lit = |v| Expr::new(ExprKind::Lit(crate::ir::Lit::Int(v)), Type::IntLit);
        let mut e = Expr::binary(BinOp::Add, lit(1), lit(2), Type::IntLit);
        settle(&mut e, Type::U64);
        assert_eq!(e.ty, Type::U64);
        let ExprKind::Binary(_, a, b) = &e.kind else { unreachable!("built as a binary") };
        assert_eq!((a.ty, b.ty), (Type::U64, Type::U64));
    }
}

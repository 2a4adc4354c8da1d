//! `helpers = "path"` in `#[kernel(...)]`: a file of device functions that kernels share.
//!
//! The file holds plain Rust `fn` items written in the kernel subset. A kernel body calls one as a
//! statement (`radix_digit(hist, prefix);`) or as a `let`'s value (`let m = warp_best(k, r);`),
//! and the lowering expands the call in place (`body::Lower::inline`): the function's parameters
//! are bound to the arguments, its locals renamed as any local is, so the emitted CUDA is what the
//! kernel would be with the function's body written out. A function sees its parameters and the
//! calling kernel's tiles, nothing else of the kernel.
//!
//! A parameter is a value (a scalar or vector type: a copy, `mut` to change it) or a reference:
//! `&[T]` or `&mut [T]` taking a device buffer or an array (local or shared) of `T`, by name. A
//! function returns a value by its last expression, or nothing; it has no early `return`.
//!
//! A proc macro cannot see other items, so the kernel names the file (or a list of files),
//! relative to its crate's manifest; the generated module includes their bytes, so that editing
//! a file recompiles the kernels that use it.

use std::collections::HashMap;
use std::path::PathBuf;

use kernel_dsl::types::{Elem, Type};
use syn::{FnArg, Ident, LitStr};

/// A device function of a helpers file.
pub(crate) struct Helper {
    pub(crate) name: Ident,
    /// The file, as the attribute gives it (for messages).
    pub(crate) path: String,
    pub(crate) params: Vec<HelperParam>,
    /// The type of the value it returns (`-> T`), if any.
    pub(crate) ret: Option<Type>,
    pub(crate) block: syn::Block,
}

impl Helper {
    /// Whether the helper is one expression of values (`fn order_key(b: u32) -> u32 { ... }`):
    /// then a call becomes that expression, wherever it stands.
    pub(crate) fn is_expression(&self) -> bool {
        self.ret.is_some()
            && matches!(self.block.stmts.as_slice(), [syn::Stmt::Expr(_, None)])
            && self.params.iter().all(|p| matches!(p.pass, Pass::Value { mutable: false, .. }))
    }
}

pub(crate) struct HelperParam {
    pub(crate) name: Ident,
    pub(crate) pass: Pass,
}

/// How an argument reaches a helper.
#[derive(Clone, Copy)]
pub(crate) enum Pass {
    /// A copy of a scalar or vector value; `mutable` when declared `mut`.
    Value { ty: Type, mutable: bool },
    /// A device buffer or an array of `elem`, by name; `mutable` for `&mut [T]`.
    Ref { elem: Elem, mutable: bool },
}

/// The helpers a kernel may call, by name, each with the file it came from.
pub(crate) struct Helpers {
    pub(crate) fns: HashMap<String, Helper>,
}

/// Reads and checks every file the attribute names; a name defined in two of them is an error.
pub(crate) fn load_all(paths: &[LitStr]) -> syn::Result<Helpers> {
    let mut fns: HashMap<String, Helper> = HashMap::new();
    for lit in paths {
        for (name, h) in load(lit)?.fns {
            if let Some(other) = fns.get(&name) {
                return Err(syn::Error::new_spanned(
                    lit,
                    format!("helper `{name}` is defined in `{}` and in `{}`", other.path, h.path),
                ));
            }
            fns.insert(name, h);
        }
    }
    Ok(Helpers { fns })
}

/// Reads and checks the helpers file named by `lit`. Errors point at the attribute's path, with
/// the file and the function named in the message (the file's own tokens have no place in the
/// kernel's source).
pub(crate) fn load(lit: &LitStr) -> syn::Result<Helpers> {
    let path = lit.value();
    let fail = |msg: String| syn::Error::new_spanned(lit, format!("helpers `{path}`: {msg}"));
    let manifest = std::env::var("CARGO_MANIFEST_DIR").map_err(|_| fail("CARGO_MANIFEST_DIR is not set".into()))?;
    let full = PathBuf::from(manifest).join(&path);
    let text = std::fs::read_to_string(&full).map_err(|e| fail(format!("cannot read {}: {e}", full.display())))?;
    parse(&text, &path).map_err(fail)
}

/// The device functions of a helpers file's text (`path` names it in messages).
pub(crate) fn parse(text: &str, path: &str) -> Result<Helpers, String> {
    let file = syn::parse_file(text).map_err(|e| format!("not Rust: {e}"))?;
    let mut fns = HashMap::new();
    for item in file.items {
        let syn::Item::Fn(f) = item else {
            return Err("holds `fn` items only".into());
        };
        let helper = helper(&f, path).map_err(|e| format!("fn {}: {e}", f.sig.ident))?;
        let name = helper.name.to_string();
        if is_intrinsic(&name) {
            return Err(format!("fn {name}: the name of an intrinsic"));
        }
        if fns.insert(name.clone(), helper).is_some() {
            return Err(format!("fn {name} is defined twice"));
        }
    }
    Ok(Helpers { fns })
}

fn helper(f: &syn::ItemFn, path: &str) -> Result<Helper, String> {
    let sig = &f.sig;
    if sig.asyncness.is_some() || sig.unsafety.is_some() || sig.constness.is_some() || sig.abi.is_some() {
        return Err("a device function is a plain `fn`".into());
    }
    if !sig.generics.params.is_empty() {
        return Err("a device function has no generics (it sees the calling kernel's tiles)".into());
    }
    if f.attrs.iter().any(|a| !a.path().is_ident("doc")) {
        return Err("only doc comments may accompany a device function".into());
    }
    let mut params = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(pt) = input else {
            return Err("a device function takes no `self`".into());
        };
        let syn::Pat::Ident(pi) = &*pt.pat else {
            return Err("each parameter is a plain name".into());
        };
        if pi.by_ref.is_some() || pi.subpat.is_some() {
            return Err("each parameter is a plain name".into());
        }
        let pass = match &*pt.ty {
            syn::Type::Reference(r) => {
                let syn::Type::Slice(s) = &*r.elem else {
                    return Err(format!("`{}`: a reference parameter is `&[T]` or `&mut [T]`", pi.ident));
                };
                if pi.mutability.is_some() {
                    return Err(format!("`{}`: a reference parameter is not `mut` itself", pi.ident));
                }
                let elem = super::kernel::elem(&s.elem).map_err(|e| e.to_string())?;
                Pass::Ref { elem, mutable: r.mutability.is_some() }
            }
            t => {
                let ty = super::kernel::elem(t).map_err(|e| e.to_string())?.as_type();
                Pass::Value { ty, mutable: pi.mutability.is_some() }
            }
        };
        params.push(HelperParam { name: pi.ident.clone(), pass });
    }
    let ret = match &sig.output {
        syn::ReturnType::Default => None,
        syn::ReturnType::Type(_, t) => Some(super::kernel::elem(t).map_err(|e| e.to_string())?.as_type()),
    };
    Ok(Helper { name: sig.ident.clone(), path: path.to_owned(), params, ret, block: (*f.block).clone() })
}

/// Whether `name` is taken by an intrinsic (with or without a type argument) or by `shared` or
/// `raw_cuda`: a helper may not shadow one.
fn is_intrinsic(name: &str) -> bool {
    use kernel_dsl::intrinsic::Intrinsic;
    let unknown = |r: Result<Intrinsic, String>| matches!(r, Err(m) if m.starts_with("unknown function"));
    name == "shared" || name == "raw_cuda" || !unknown(Intrinsic::from_function(name, None))
}

#[cfg(test)]
mod tests {
    use kernel_dsl::ir::{ExprKind, Stmt};

    use super::*;
    use crate::parse::body::lower;
    use crate::parse::kernel::ParamDecl;

    const FILE: &str = r#"
        /// One expression of values: inlined where it stands.
        fn order_key(bits: u32) -> u32 {
            bits ^ (if bits >= 0x80000000 { u32::MAX } else { 0x80000000 })
        }
        fn twice(v: f32) -> f32 {
            let w = v + v;
            w
        }
        fn store(out: &mut [f32], at: u32, v: f32) {
            let w = twice(v);
            out[at] = w;
        }
        fn read_only(x: &[f32]) -> f32 {
            x[0]
        }
        fn writes(x: &mut [f32]) {
            x[0] = 1.0;
        }
        fn ends_early(x: &mut [f32]) {
            if x[0] > 0.0 {
                return;
            }
            x[0] = 1.0;
        }
        fn again(v: f32) -> f32 {
            let w = again(v);
            w
        }
        fn tiles(v: u32) -> u32 {
            let w = v * WARPS;
            w
        }
        fn kernel_local() -> u32 {
            let w = acc;
            w
        }
    "#;

    fn helpers() -> Helpers {
        parse(FILE, "helpers.rs").expect("the test file parses")
    }

    fn params() -> Vec<ParamDecl> {
        let p = |n: &str, ty| ParamDecl { name: syn::Ident::new(n, proc_macro2::Span::call_site()), ty };
        vec![
            p("x", Type::Ptr { elem: Elem::Scalar(kernel_dsl::types::Scalar::F32), mutable: false }),
            p("y", Type::Ptr { elem: Elem::Scalar(kernel_dsl::types::Scalar::F32), mutable: true }),
            p("n", Type::U32),
        ]
    }

    /// The body lowered with the test file's helpers and a tile WARPS, or the error's message.
    fn body(src: &str) -> Result<Vec<Stmt>, String> {
        let block: syn::Block = syn::parse_str(src).expect("a block");
        let arg: syn::FnArg = syn::parse_quote!(#[tile(default = 4, candidates = [4])] WARPS: u32);
        let FnArg::Typed(tile) = arg else { panic!("a typed argument") };
        let attr = tile.attrs.first().expect("an attribute");
        let tiles = vec![crate::parse::tiles::parse(attr, &tile).expect("a tile")];
        lower(&block, &tiles, &params(), &helpers()).map(|l| l.body).map_err(|e| e.to_string())
    }

    fn names(stmts: &[Stmt]) -> Vec<String> {
        stmts
            .iter()
            .filter_map(|s| match s {
                Stmt::Let { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_expression_helper_becomes_its_expression() {
        let stmts = body("{ let k = order_key(n) + 1; }").expect("lowers");
        assert_eq!(names(&stmts), ["k"]);
        let Stmt::Let { init, .. } = &stmts[0] else { panic!("{stmts:?}") };
        let mut reads_n = 0;
        init.visit(&mut |e| reads_n += usize::from(matches!(&e.kind, ExprKind::Var(v) if v == "n")));
        assert_eq!(reads_n, 2, "the argument stands where the parameter did: {init:?}");
    }

    #[test]
    fn a_helper_with_statements_is_expanded_with_fresh_names() {
        // Every name unique, numbered in the order the lets come: the helper's body before the
        // kernel's `let w` that takes its value.
        let stmts = body("{ let v = 2.0; let w = twice(v); store(y, n, w); }").expect("lowers");
        assert_eq!(names(&stmts), ["v", "v_1", "w", "w_1", "at", "v_2", "v_3", "w_2", "w_3"]);
        assert!(matches!(stmts.last(), Some(Stmt::Assign { .. })), "{stmts:?}");
    }

    #[test]
    fn a_helper_sees_the_kernels_tiles_and_nothing_else_of_it() {
        body("{ let t = tiles(n); }").expect("a tile is in scope");
        let e = body("{ let acc = 1u32; let t = kernel_local(); }").expect_err("a kernel local is not");
        assert!(e.contains("in helper `kernel_local`") && e.contains("acc"), "{e}");
    }

    #[test]
    fn misuse_is_reported_at_the_call() {
        let cases = [
            ("{ let s = 1.0 + twice(2.0); }", "has statements: call it as a statement"),
            ("{ store(y, n); }", "takes 3 arguments, 2 given"),
            ("{ writes(x); }", "writes, and this buffer or array is read-only"),
            ("{ let v = read_only(x[0]); }", "takes a buffer or an array by its name"),
            ("{ ends_early(y); }", "a helper has no `return`"),
            ("{ let v = again(1.0); }", "calls itself"),
            ("{ twice(1.0); }", "the value of helper `twice` is not used"),
            ("{ let v = writes(y); }", "returns nothing"),
            ("{ let k = order_key(atomic_add(y, 0, 1.0) as u32); }", "may be evaluated more than once"),
            ("{ let k = order_key::<u32>(n); }", "takes no type arguments"),
        ];
        for (src, want) in cases {
            let e = body(src).expect_err(src);
            assert!(e.contains(want), "{src}: {e}");
        }
    }

    #[test]
    fn a_file_is_fn_items_with_names_of_their_own() {
        assert!(parse("const A: u32 = 1;", "h.rs").err().is_some_and(|e| e.contains("`fn` items only")));
        assert!(parse("fn max(a: u32) -> u32 { a }", "h.rs").err().is_some_and(|e| e.contains("intrinsic")));
        assert!(parse("fn f() {} fn f() {}", "h.rs").err().is_some_and(|e| e.contains("defined twice")));
        assert!(parse("fn f<T>(a: T) {}", "h.rs").err().is_some_and(|e| e.contains("no generics")));
        assert!(parse("fn f(a: &u32) {}", "h.rs").err().is_some_and(|e| e.contains("`&[T]` or `&mut [T]`")));
    }
}

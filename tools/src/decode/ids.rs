//! Lists of token ids as the user gives them: `1,2,3` on the command line, or a file of ids
//! separated by commas or white space, or a safetensors file with a `tokens` tensor (the goldens'
//! layout, I64 or I32), and the check that each id is inside the vocabulary.

use std::path::Path;

use engine::model::checkpoint::CheckpointError;
use safetensors::SafeTensors;

use super::error::{Result, fail};

/// Parses `1,2,3` (commas and/or white space between ids). `what` names the option in errors.
pub fn parse_list(text: &str, what: &str) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for part in text.split(|c: char| c == ',' || c.is_whitespace()).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(id) => ids.push(id),
            Err(_) => return fail(format!("{what}: `{part}` is not a token id (a non-negative integer)")),
        }
    }
    Ok(ids)
}

/// The ids of `arg`: a file when one exists at that path (safetensors by its `.safetensors`
/// extension, text otherwise), else the list itself.
pub fn read_ids(arg: &str, what: &str) -> Result<Vec<u32>> {
    let path = Path::new(arg);
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(path).map_err(|e| format!("{what}: cannot read {arg}: {e}"))?;
            let st = SafeTensors::deserialize(&bytes)
                .map_err(|e| format!("{what}: {arg} is not a safetensors file: {e}"))?;
            let t = st.tensor("tokens").map_err(|_| format!("{what}: {arg} has no `tokens` tensor"))?;
            let as_ref = engine::model::checkpoint::TensorRef {
                name: "tokens",
                dtype: t.dtype(),
                shape: t.shape(),
                bytes: t.data(),
            };
            let raw = as_ref.to_i64().map_err(|e: CheckpointError| format!("{what}: {arg}: {e}"))?;
            return raw
                .into_iter()
                .map(|v| u32::try_from(v).or_else(|_| fail(format!("{what}: {arg} holds {v}, not a token id"))))
                .collect();
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{what}: cannot read {arg}: {e}"))?;
        return parse_list(&text, &format!("{what} ({arg})"));
    }
    let looks_like_list = arg.chars().all(|c| c.is_ascii_digit() || c == ',' || c.is_whitespace());
    if !looks_like_list {
        return fail(format!("{what}: `{arg}` is neither a file nor a list of token ids like 1,2,3"));
    }
    parse_list(arg, what)
}

/// Fails, naming the first id ≥ `vocab` and its place, when any is.
pub fn check_vocab(ids: &[u32], vocab: usize, what: &str) -> Result<()> {
    match ids.iter().enumerate().find(|(_, id)| **id as usize >= vocab) {
        Some((i, id)) => fail(format!(
            "{what}: token id {id} (at index {i}) is out of range: the model's vocabulary has {vocab} ids (0..{})",
            vocab - 1
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_with_commas_and_spaces() {
        assert_eq!(parse_list("1,2, 3\n4", "x").expect("ids"), vec![1, 2, 3, 4]);
        assert_eq!(parse_list("", "x").expect("ids"), Vec::<u32>::new());
        assert!(parse_list("1,-2", "--prompt-ids").expect_err("bad").to_string().contains("`-2` is not a token id"));
    }

    #[test]
    fn ids_past_the_vocabulary_are_named() {
        assert!(check_vocab(&[1, 511], 512, "x").is_ok());
        let e = check_vocab(&[1, 512], 512, "--prompt-ids").expect_err("past").to_string();
        assert!(e.contains("token id 512 (at index 1)") && e.contains("512 ids"), "{e}");
    }
}

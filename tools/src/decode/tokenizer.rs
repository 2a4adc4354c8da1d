//! Text to token ids and back: the checkpoint's `tokenizer.json` (Hugging Face `tokenizers`), or,
//! for a model without one whose vocabulary has at least 256 ids (the embedded tiny model), bytes:
//! a prompt's UTF-8 bytes are its ids, and ids below 256 print as those bytes.
//!
//! Output streams as it is decoded. With a tokenizer.json the growing id list (prompt included, so
//! a first token's leading space survives) is decoded after each token and the new suffix printed,
//! held back while it ends in an incomplete UTF-8 sequence. With bytes, valid UTF-8 prints as
//! text and anything else as `<id>`: ids ≥ 256, bytes that are not valid UTF-8, and control bytes
//! other than newline and tab (so a random model cannot drive the terminal).

use std::path::Path;

use super::error::{Result, fail};

/// How text and ids map for one model.
#[derive(Debug)]
pub enum Tokenizer {
    /// The model's `tokenizer.json`.
    Hf(Box<tokenizers::Tokenizer>),
    /// UTF-8 bytes are ids 0..256 (the model has no tokenizer.json).
    Bytes,
    /// No tokenizer.json and fewer than 256 ids: ids in, `<id>` out.
    IdsOnly,
}

impl Tokenizer {
    /// `dir/tokenizer.json` when there is one, else bytes when `vocab` ≥ 256, else ids only.
    pub fn for_model(dir: Option<&Path>, vocab: usize) -> Result<Tokenizer> {
        if let Some(path) = dir.map(|d| d.join("tokenizer.json")).filter(|p| p.is_file()) {
            let tok = tokenizers::Tokenizer::from_file(&path)
                .map_err(|e| format!("{}: not a tokenizer this binary can read: {e}", path.display()))?;
            return Ok(Tokenizer::Hf(Box::new(tok)));
        }
        Ok(if vocab >= 256 { Tokenizer::Bytes } else { Tokenizer::IdsOnly })
    }

    /// One line for the user on what maps text to ids.
    pub fn describe(&self) -> String {
        match self {
            Tokenizer::Hf(t) => format!("tokenizer.json ({} ids)", t.get_vocab_size(true)),
            Tokenizer::Bytes => {
                "no tokenizer.json: byte-level fallback (UTF-8 bytes are ids 0..256; other ids print as <id>)"
                    .to_owned()
            }
            Tokenizer::IdsOnly => {
                "no tokenizer.json and fewer than 256 ids: ids only (output prints as <id>)".to_owned()
            }
        }
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Hf(t) => {
                Ok(t.encode(text, false).map_err(|e| format!("--prompt: cannot encode: {e}"))?.get_ids().to_vec())
            }
            Tokenizer::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokenizer::IdsOnly => fail(
                "--prompt needs a tokenizer: the model has no tokenizer.json and fewer than 256 ids; give --prompt-ids",
            ),
        }
    }

    /// A stream of output text after `prompt`, and the prompt's own text (to echo).
    pub fn stream(&self, prompt: &[u32]) -> Result<(TextStream<'_>, String)> {
        Ok(match self {
            Tokenizer::Hf(t) => {
                let printed = decode(t, prompt)?;
                let echo = printed.clone();
                (TextStream::Hf { tok: t, ids: prompt.to_vec(), printed }, echo)
            }
            Tokenizer::Bytes | Tokenizer::IdsOnly => {
                let mut s = if matches!(self, Tokenizer::Bytes) {
                    TextStream::Bytes { pending: Vec::new() }
                } else {
                    TextStream::IdsOnly
                };
                let mut echo = String::new();
                for &id in prompt {
                    echo += &s.push(id)?;
                }
                (s, echo)
            }
        })
    }
}

fn decode(t: &tokenizers::Tokenizer, ids: &[u32]) -> Result<String> {
    Ok(t.decode(ids, true).map_err(|e| format!("the tokenizer cannot decode the ids: {e}"))?)
}

/// Output text, token by token.
#[derive(Debug)]
pub enum TextStream<'t> {
    Hf { tok: &'t tokenizers::Tokenizer, ids: Vec<u32>, printed: String },
    Bytes { pending: Vec<u8> },
    IdsOnly,
}

impl TextStream<'_> {
    /// The text `id` adds (possibly none yet).
    pub fn push(&mut self, id: u32) -> Result<String> {
        match self {
            TextStream::Hf { tok, ids, printed } => {
                ids.push(id);
                let text = decode(tok, ids)?;
                if text.ends_with('\u{FFFD}') {
                    return Ok(String::new());
                }
                // Decoders may rewrite earlier text (cleanup of spaces); print only past the old end.
                let new = text.get(printed.len()..).unwrap_or("").to_owned();
                *printed = text;
                Ok(new)
            }
            TextStream::Bytes { pending } => {
                let mut out = String::new();
                if id < 256 {
                    pending.push(id as u8);
                    drain_utf8(pending, &mut out, false);
                } else {
                    drain_utf8(pending, &mut out, true);
                    out.push_str(&format!("<{id}>"));
                }
                Ok(out)
            }
            TextStream::IdsOnly => Ok(format!("<{id}>")),
        }
    }

    /// What is still held back (an incomplete UTF-8 sequence at the end).
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        if let TextStream::Bytes { pending } = self {
            drain_utf8(pending, &mut out, true);
        }
        out
    }
}

/// Moves the valid UTF-8 at the front of `pending` to `out` (control characters other than newline
/// and tab as `<id>`), invalid bytes as `<id>`; keeps an incomplete sequence at the end unless
/// `all`.
fn drain_utf8(pending: &mut Vec<u8>, out: &mut String, all: bool) {
    let mut rest: &[u8] = pending;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                push_visible(s, out);
                rest = &[];
                break;
            }
            Err(e) => {
                let (valid, tail) = rest.split_at(e.valid_up_to());
                push_visible(std::str::from_utf8(valid).unwrap_or_default(), out);
                let bad = match e.error_len() {
                    Some(n) => n,
                    None if all => tail.len(),
                    None => {
                        rest = tail;
                        break;
                    }
                };
                for b in &tail[..bad] {
                    out.push_str(&format!("<{b}>"));
                }
                rest = &tail[bad..];
            }
        }
    }
    *pending = rest.to_vec();
}

fn push_visible(s: &str, out: &mut String) {
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("<{}>", c as u32));
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_out(ids: &[u32]) -> String {
        let t = Tokenizer::Bytes;
        let (mut s, _) = t.stream(&[]).expect("stream");
        let mut out = String::new();
        for &id in ids {
            out += &s.push(id).expect("push");
        }
        out + &s.finish()
    }

    #[test]
    fn bytes_round_trip_text_and_mark_the_rest() {
        let t = Tokenizer::Bytes;
        let ids = t.encode("héllo\n").expect("ids");
        assert_eq!(ids.len(), 7);
        assert_eq!(bytes_out(&ids), "héllo\n");
        assert_eq!(bytes_out(&[104, 300, 105]), "h<300>i");
        // Escape (27) and an invalid lead byte (255) print as ids; a cut sequence at the end too.
        assert_eq!(bytes_out(&[27, 65, 255, 66, 0xC3]), "<27>A<255>B<195>");
        // A sequence split over tokens is held until whole.
        let (mut s, echo) = t.stream(&[104, 105]).expect("stream");
        assert_eq!(echo, "hi");
        assert_eq!(s.push(0xC3).expect("push"), "");
        assert_eq!(s.push(0xA9).expect("push"), "é");
    }

    #[test]
    fn ids_only_refuses_text() {
        let t = Tokenizer::for_model(None, 100).expect("tokenizer");
        assert!(t.encode("hi").expect_err("no text").to_string().contains("--prompt-ids"));
        assert_eq!(t.stream(&[]).expect("stream").0.push(5).expect("push"), "<5>");
    }
}

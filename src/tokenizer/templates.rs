//! Where a chat template comes from: the model file, a file the user names, or one built in for
//! a model family whose files often carry none (Gemma 3's base model has none; llama.cpp would
//! then use ChatML, which Gemma does not understand).

use std::io::Read;
use std::path::Path;

use super::chat::special_texts;
use super::{ChatTemplate, Tokenizer, TokenizerError};

/// Most bytes of a template file (the largest templates models ship are ~10 KB).
pub const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// The templates built in, by name.
const BUILT_IN: [(&str, &str); 2] = [
    ("chatml", include_str!("templates/chatml.jinja")),
    ("gemma", include_str!("templates/gemma.jinja")),
];

/// The names of the built-in templates.
pub fn built_in_names() -> Vec<&'static str> {
    BUILT_IN.iter().map(|(n, _)| *n).collect()
}

/// The built-in template for a model file of architecture `arch` that has none: Gemma's turns
/// for Gemma. Other families have no single format (llama.cpp guesses ChatML, which a model
/// not trained on it answers with nonsense): none, and chats are refused unless the user
/// names a template.
pub fn built_in_for(arch: &str) -> Option<&'static str> {
    arch.starts_with("gemma").then_some("gemma")
}

impl ChatTemplate {
    /// The built-in template `name`, with the tokenizer's BOS/EOS texts.
    pub fn built_in(name: &str, tok: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        let (bos, eos) = special_texts(tok);
        ChatTemplate::built_in_with(name, &bos, &eos)
    }

    /// The template a user names: a Jinja file, or (when no such file exists) the name of a
    /// built-in template.
    pub fn from_user(spec: &Path, tok: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        let (bos, eos) = special_texts(tok);
        ChatTemplate::from_user_with(spec, &bos, &eos)
    }

    fn built_in_with(name: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TokenizerError> {
        let (_, source) = BUILT_IN.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            TokenizerError::Template(format!(
                "no built-in template {name:?} (built in: {})",
                built_in_names().join(", ")
            ))
        })?;
        Ok(ChatTemplate::new(source, bos, eos)?.with_origin(format!("built-in '{name}'")))
    }

    fn from_user_with(spec: &Path, bos: &str, eos: &str) -> Result<ChatTemplate, TokenizerError> {
        let shown = spec.display();
        let file = match std::fs::File::open(spec) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(name) = spec.to_str()
                    && BUILT_IN.iter().any(|(n, _)| *n == name)
                {
                    return ChatTemplate::built_in_with(name, bos, eos);
                }
                return Err(TokenizerError::Template(format!(
                    "{shown}: no such file, nor a built-in template ({})",
                    built_in_names().join(", ")
                )));
            }
            Err(e) => return Err(TokenizerError::Template(format!("{shown}: {e}"))),
        };
        let mut bytes = Vec::new();
        file.take(MAX_TEMPLATE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| TokenizerError::Template(format!("{shown}: {e}")))?;
        if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
            return Err(TokenizerError::Template(format!(
                "{shown}: larger than {} KiB",
                MAX_TEMPLATE_BYTES >> 10
            )));
        }
        let source = String::from_utf8(bytes)
            .map_err(|_| TokenizerError::Template(format!("{shown}: not UTF-8")))?;
        ChatTemplate::new(&source, bos, eos)
            .map_err(|e| TokenizerError::Template(format!("{shown}: {e}")))
            .map(|t| t.with_origin(format!("from {shown}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::ChatMessage;

    /// `from_user` without a tokenizer: no BOS/EOS texts.
    fn from_user(spec: &Path) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::from_user_with(spec, "", "")
    }

    #[test]
    fn a_named_template_is_a_file_or_a_built_in_name() {
        let dir = tempfile::tempdir().unwrap();
        let msgs = [ChatMessage::new("user", "hi")];
        let file = dir.path().join("t.jinja");
        std::fs::write(
            &file,
            "[{% for m in messages %}{{ m.content }}{% endfor %}]",
        )
        .unwrap();
        let t = from_user(&file).unwrap();
        assert_eq!(t.render(&msgs, true).unwrap(), "[hi]");
        assert_eq!(t.origin(), format!("from {}", file.display()));

        let t = from_user(Path::new("chatml")).unwrap();
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let t = from_user(Path::new("gemma")).unwrap();
        let sys = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", " hi "),
        ];
        assert_eq!(
            t.render(&sys, true).unwrap(),
            "<start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\n"
        );
        let turns = [
            ChatMessage::new("user", "a"),
            ChatMessage::new("assistant", "b"),
        ];
        assert_eq!(
            t.render(&turns, false).unwrap(),
            "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n"
        );
        let out_of_order = [ChatMessage::new("assistant", "b")];
        assert!(t.render(&out_of_order, true).is_err());
    }

    #[test]
    fn a_template_file_that_is_missing_huge_binary_or_broken_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let err = |path: &Path| from_user(path).err().unwrap().to_string();
        let e = err(&p("none.jinja"));
        assert!(
            e.contains("none.jinja: no such file, nor a built-in template (chatml, gemma)"),
            "{e}"
        );
        std::fs::write(p("big"), vec![b' '; MAX_TEMPLATE_BYTES as usize + 1]).unwrap();
        assert!(err(&p("big")).contains("big: larger than 1024 KiB"));
        std::fs::write(p("bin"), [0xff, 0xfe, 0x00]).unwrap();
        assert!(err(&p("bin")).contains("bin: not UTF-8"));
        std::fs::write(p("broken"), "{% for m in messages %}").unwrap();
        let e = err(&p("broken"));
        assert!(e.contains("broken: chat template:"), "{e}");
        // A directory is not a template.
        assert!(err(dir.path()).contains(&dir.path().display().to_string()));
    }
}

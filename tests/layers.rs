//! The crate's layering, read from its source: the engine (`src/engine.rs`, `src/engine/`)
//! depends on no algorithm. Nothing in its code (comments and string literals aside, tests
//! included) names the `policies` module or a type the crate exports from it, so that the
//! engine can be read, changed and tested below every policy, and a policy never has to be
//! built for the engine to be.

use std::fs;
use std::path::{Path, PathBuf};

/// The crate's root, where `Cargo.toml` is.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, recursively, in a stable order.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// `source` with its comments and the contents of its string and character literals blanked
/// out (each replaced by spaces, newlines kept), so that only code is left to search. Handles
/// line and nested block comments, escapes, raw strings (`r"…"`, `r#"…"#`, byte forms too)
/// and tells a character literal (`'a'`, `'\n'`) from a lifetime (`'a`).
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            loop {
                match (chars.get(i), chars.get(i + 1)) {
                    (Some('/'), Some('*')) => {
                        depth += 1;
                        out.push_str("  ");
                        i += 2;
                    }
                    (Some('*'), Some('/')) => {
                        depth -= 1;
                        out.push_str("  ");
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    }
                    (Some(&c), _) => {
                        out.push(blank(c));
                        i += 1;
                    }
                    (None, _) => break,
                }
            }
        } else if (c == 'r' || (c == 'b' && next == Some('r')))
            && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && {
                let start = if c == 'b' { i + 2 } else { i + 1 };
                let hashes = chars[start..].iter().take_while(|&&h| h == '#').count();
                chars.get(start + hashes) == Some(&'"')
            }
        {
            // A raw string: up to the quote followed by as many `#` as opened it.
            let start = if c == 'b' { i + 2 } else { i + 1 };
            let hashes = chars[start..].iter().take_while(|&&h| h == '#').count();
            out.extend(std::iter::repeat(' ').take(start + hashes + 1 - i));
            i = start + hashes + 1;
            while i < chars.len() {
                if chars[i] == '"'
                    && chars[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes
                {
                    out.extend(std::iter::repeat(' ').take(hashes + 1));
                    i += hashes + 1;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let skip = if chars[i] == '\\' { 2 } else { 1 };
                for &c in &chars[i..(i + skip).min(chars.len())] {
                    out.push(blank(c));
                }
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal (a lifetime has no closing quote two characters on).
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                let skip = if chars[i] == '\\' { 2 } else { 1 };
                out.extend(std::iter::repeat(' ').take(skip));
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The identifiers of `code`, with their line numbers.
fn identifiers(code: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find(|c: char| c.is_alphabetic() || c == '_') {
            let tail = &rest[start..];
            let end = tail.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(tail.len());
            // Not the tail of a number's suffix (`1u64`): the character before is not a digit.
            let before = rest[..start].chars().last();
            if !before.is_some_and(|b| b.is_ascii_digit()) {
                found.push((n + 1, &tail[..end]));
            }
            rest = &tail[end..];
        }
    }
    found
}

/// The names `src/lib.rs` exports from the `policies` module (`pub use policies::…::{A, B};`):
/// the algorithms' types, which the engine must not name.
fn policy_exports() -> Vec<String> {
    let lib = fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let code = code_only(&lib);
    let mut names = Vec::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(path) = statement.strip_prefix("pub use policies::") else { continue };
        let list = match path.split_once('{') {
            Some((_, list)) => list.trim_end_matches('}').to_owned(),
            None => path.rsplit("::").next().unwrap_or_default().to_owned(),
        };
        for name in list.split(',') {
            // `A as B` exports `B`.
            let name = name.split_whitespace().last().unwrap_or_default();
            if !name.is_empty() {
                names.push(name.to_owned());
            }
        }
    }
    names
}

#[test]
fn the_engine_names_no_policy() {
    let forbidden = policy_exports();
    // The list is read, not assumed: the token bucket is among the policies' exports.
    assert!(
        forbidden.iter().any(|n| n == "TokenBucket"),
        "no `pub use policies::…` of TokenBucket found in src/lib.rs: {forbidden:?}"
    );
    let mut files = vec![root().join("src/engine.rs")];
    rust_files(&root().join("src/engine"), &mut files);
    assert!(files.len() > 5, "the engine's files were not found: {files:?}");
    let mut offences = Vec::new();
    for file in &files {
        let source =
            fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let code = code_only(&source);
        for (line, ident) in identifiers(&code) {
            if ident == "policies" || forbidden.iter().any(|f| f == ident) {
                let shown = file.strip_prefix(root()).unwrap_or(file).display();
                offences.push(format!("{shown}:{line}: `{ident}`"));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "the engine must not depend on a policy (move the code to `src/policies/`, or what both \
         need below both, into the engine), but it names one at:\n{}",
        offences.join("\n")
    );
}

/// The scanner itself: comments and literals are not code, identifiers in code are found.
#[test]
fn the_scanner_reads_only_code() {
    let source = r##"
use crate::policies::x; // TokenBucket in a comment
/* TokenBucket /* nested */ TokenBucket */ let s = "TokenBucket \" TokenBucket";
let r = r#"TokenBucket "quoted" "#; let c = '"'; let l: &'static str = "";
fn f<'a>(x: &'a Rate) -> TokenBucket { 1u64 }
"##;
    let code = code_only(source);
    let names: Vec<_> = identifiers(&code).into_iter().map(|(_, i)| i).collect();
    assert_eq!(names.iter().filter(|&&i| i == "TokenBucket").count(), 1, "{code}");
    assert!(names.contains(&"policies") && names.contains(&"Rate") && names.contains(&"static"));
    assert!(!names.contains(&"quoted") && !names.contains(&"nested") && !names.contains(&"u64"));
    assert_eq!(code.lines().count(), source.lines().count());
}

//! What envoyproxy/ratelimit's YAML decoder (go-yaml v2, YAML 1.1) makes of a plain scalar,
//! so that this loader accepts and refuses the same files: a key that is a number, a float
//! where a string was expected, `yes` for a boolean.
//!
//! Quoted scalars are always strings; only plain ones are resolved.

use marked_yaml::types::{MarkedScalarNode, Node};

/// A scalar's YAML 1.1 type, as go-yaml v2 resolves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool(bool),
    /// An integer that fits an `int64` or a `uint64`, with its value when it is not negative.
    Int(Option<u64>),
    /// A float, or an integer beyond 64 bits (which go-yaml resolves as a float).
    Float,
    Str,
}

impl Kind {
    /// go-yaml's tag name for error messages (`!!int`, `!!str`, ...).
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Kind::Null => "!!null",
            Kind::Bool(_) => "!!bool",
            Kind::Int(_) => "!!int",
            Kind::Float => "!!float",
            Kind::Str => "!!str",
        }
    }
}

/// The type of `s`, a plain scalar when `plain`.
pub(crate) fn kind(s: &str, plain: bool) -> Kind {
    if !plain {
        return Kind::Str;
    }
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Kind::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Kind::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Kind::Bool(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf" | "-.INF" | ".nan"
        | ".NaN" | ".NAN" => return Kind::Float,
        _ => {}
    }
    if let Some(int) = integer(s) {
        return int;
    }
    if is_float(s) {
        return Kind::Float;
    }
    Kind::Str
}

/// The kind of a scalar node.
pub(crate) fn scalar_kind(node: &MarkedScalarNode) -> Kind {
    kind(node.as_str(), node.may_coerce())
}

/// An integer in one of YAML 1.1's forms: decimal, `0x` hex, `0o` or leading-`0` octal, `0b`
/// binary, with an optional sign and `_` separators. `None` if `s` is not one.
fn integer(s: &str) -> Option<Kind> {
    let (negative, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let digits: String = body.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || body.starts_with('_') {
        return None;
    }
    let (radix, rest) = if let Some(r) = digits.strip_prefix("0x") {
        (16, r)
    } else if let Some(r) = digits.strip_prefix("0b") {
        (2, r)
    } else if let Some(r) = digits.strip_prefix("0o") {
        (8, r)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits.as_str())
    };
    if rest.is_empty() || !rest.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    match u64::from_str_radix(rest, radix) {
        Ok(v) if !negative => Some(Kind::Int(Some(v))),
        Ok(0) => Some(Kind::Int(Some(0))),
        Ok(v) if v <= 1 << 63 => Some(Kind::Int(None)),
        // Past 64 bits go-yaml reads the number as a float.
        _ => Some(Kind::Float),
    }
}

/// go-yaml's float form: `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, once its
/// `_` separators are dropped.
fn is_float(s: &str) -> bool {
    // go-yaml tries numbers only for scalars that start with a digit, a sign or a point, and
    // drops the `_`s first.
    if !s.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '-' | '+' | '.')) {
        return false;
    }
    let s = s.replace('_', "");
    let s = s.strip_prefix(['-', '+']).unwrap_or(&s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// A node as go-yaml's `%v` prints it in an error message: a scalar's text, a list as
/// `[a b]`, a mapping as `map[k:v]`.
pub(crate) fn render(node: &Node) -> String {
    match node {
        Node::Scalar(s) => s.as_str().to_owned(),
        Node::Sequence(items) => format!("[{}]", items.iter().map(render).collect::<Vec<_>>().join(" ")),
        Node::Mapping(map) => format!(
            "map[{}]",
            map.iter().map(|(k, v)| format!("{}:{}", k.as_str(), render(v))).collect::<Vec<_>>().join(" ")
        ),
    }
}

/// The line (1-based) a node starts on, where the parser recorded one.
pub(crate) fn line(node: &Node) -> Option<usize> {
    node.span().start().map(|m| m.line())
}

/// The line a scalar starts on.
pub(crate) fn scalar_line(node: &MarkedScalarNode) -> Option<usize> {
    node.span().start().map(|m| m.line())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_scalars_resolve_as_go_yaml_v2_resolves_them() {
        for (s, k) in [
            ("", Kind::Null),
            ("~", Kind::Null),
            ("yes", Kind::Bool(true)),
            ("Off", Kind::Bool(false)),
            ("5", Kind::Int(Some(5))),
            ("+5", Kind::Int(Some(5))),
            ("0x1F", Kind::Int(Some(31))),
            ("017", Kind::Int(Some(15))),
            ("0b101", Kind::Int(Some(5))),
            ("1_000", Kind::Int(Some(1000))),
            ("-1", Kind::Int(None)),
            ("0.25", Kind::Float),
            ("1e3", Kind::Float),
            (".5", Kind::Float),
            ("3.", Kind::Float),
            (".inf", Kind::Float),
            ("99999999999999999999", Kind::Float),
            ("foo", Kind::Str),
            ("1.2.3", Kind::Str),
            ("5s", Kind::Str),
            ("files/*", Kind::Str),
            ("0x", Kind::Str),
            ("_1", Kind::Str),
        ] {
            assert_eq!(kind(s, true), k, "{s:?}");
        }
        assert_eq!(kind("5", false), Kind::Str);
        assert_eq!(kind("true", false), Kind::Str);
    }
}

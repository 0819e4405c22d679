//! Which rule a request's descriptor falls under, and the names its counts go by: upstream's
//! walk of the descriptor tree and its statistics keys.
//!
//! A request descriptor is a list of entries `(key, value)`. The walk starts at the domain and
//! takes one level per entry: at each, the child `key_value` if there is one, else the first
//! child (in file order) whose `key_value` pattern with `*`s matches, else the child `key` (a
//! rule for any value). A rule applies only on the level of the request's last entry: a
//! request of two entries never takes a first-level rule.

use crate::config::{Descriptor, Domain};

/// How one level of the walk was matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Matched {
    /// The child `key_value`.
    Exact,
    /// A child whose composite key (`key_pattern`) matched with its `*`s.
    Wildcard(String),
    /// The child `key`, for any value.
    Key,
}

/// A rule found for a request descriptor.
#[derive(Clone, Debug)]
pub struct Found<'c> {
    /// The descriptor holding the rule (its `rate_limit` is set).
    pub descriptor: &'c Descriptor,
    /// How each level was matched, one per request entry.
    pub levels: Vec<Matched>,
    /// Per entry, the wildcard's value pattern when the level's descriptor shares its
    /// threshold (`share_threshold`): the counter goes by the pattern, not the value.
    pub shared: Vec<Option<String>>,
    /// The statistics' name (upstream's full key), e.g. `domain.key1_value1.key2`.
    pub stats_key: String,
}

/// `*` in `pattern` matching any run of characters (none included) in `text`.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else { return pattern == text };
    // The parts between the first `*` and the last, and the part after the last.
    let (middle_parts, last) = rest.rsplit_once('*').unwrap_or(("", rest));
    if text.len() < first.len() + last.len() || !text.starts_with(first) || !text.ends_with(last) {
        return false;
    }
    let mut middle = &text[first.len()..text.len() - last.len()];
    for part in middle_parts.split('*') {
        match middle.find(part) {
            Some(i) => middle = &middle[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// A request descriptor's rule as the service needs it.
pub(crate) enum Lookup<'c> {
    /// The rule, whose statistics go by its own full key and whose counter by the request's
    /// values: found without allocating.
    Plain(&'c Descriptor),
    /// The rule, with a statistics name or a shared counter that depends on the match.
    Full(Found<'c>),
}

impl Domain {
    /// [`find`](Domain::find) for the decision path: without an allocation unless the rule's
    /// statistics name or counter depends on how it was matched (`detailed_metric`,
    /// `value_to_metric`, `share_threshold` on the way), `composite` a buffer to reuse.
    pub(crate) fn lookup<'c>(
        &'c self,
        entries: &[(String, String)],
        composite: &mut String,
    ) -> Option<Lookup<'c>> {
        let mut parent = &self.root;
        let mut found = None;
        let mut plain = true;
        for (i, (key, value)) in entries.iter().enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let node = if let Some(node) = parent.children.get(composite.as_str()) {
                node
            } else if let Some(pattern) = parent.wildcards.iter().find(|w| wildcard_match(w, composite)) {
                let node = &parent.children[pattern];
                plain &= !node.share_threshold;
                node
            } else if let Some(node) = parent.children.get(key.as_str()) {
                node
            } else {
                break;
            };
            plain &= !node.value_to_metric;
            if node.rate_limit.is_some() && i + 1 == entries.len() {
                found = Some(node);
            }
            if node.children.is_empty() {
                break;
            }
            parent = node;
        }
        let leaf = found?;
        if plain && !leaf.detailed_metric {
            return Some(Lookup::Plain(leaf));
        }
        let entries: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.find(&entries).map(Lookup::Full)
    }

    /// The rule for a request descriptor's entries, if one applies.
    pub fn find<'c>(&'c self, entries: &[(&str, &str)]) -> Option<Found<'c>> {
        let mut parent = &self.root;
        let mut levels = Vec::with_capacity(entries.len());
        let mut shared = Vec::with_capacity(entries.len());
        let mut path: Vec<&Descriptor> = Vec::with_capacity(entries.len());
        let mut found = None;
        for (i, &(key, value)) in entries.iter().enumerate() {
            let composite = format!("{key}_{value}");
            let (node, how) = if let Some(node) = parent.children.get(&composite) {
                (node, Matched::Exact)
            } else if let Some(pattern) = parent.wildcards.iter().find(|w| wildcard_match(w, &composite)) {
                (&parent.children[pattern], Matched::Wildcard(pattern.clone()))
            } else if let Some(node) = parent.children.get(key) {
                (node, Matched::Key)
            } else {
                break;
            };
            shared.push(match &how {
                Matched::Wildcard(pattern) if node.share_threshold => {
                    Some(pattern.strip_prefix(&format!("{key}_")).unwrap_or(pattern).to_owned())
                }
                _ => None,
            });
            levels.push(how);
            path.push(node);
            if node.rate_limit.is_some() && i + 1 == entries.len() {
                found = Some(node);
            }
            if node.children.is_empty() {
                break;
            }
            parent = node;
        }
        let descriptor = found?;
        let stats_key = stats_key(&self.name, entries, &path, &levels, &shared, descriptor);
        Some(Found { descriptor, levels, shared, stats_key })
    }
}

/// Upstream's statistics key for a match: the request's own values under `detailed_metric`;
/// otherwise per level the shared pattern, the request's value (an exact match, or
/// `value_to_metric`), the wildcard's pattern, or nothing (a key matched for any value).
fn stats_key(
    domain: &str,
    entries: &[(&str, &str)],
    path: &[&Descriptor],
    levels: &[Matched],
    shared: &[Option<String>],
    leaf: &Descriptor,
) -> String {
    let mut out = domain.to_owned();
    let any_shared = shared.iter().any(Option::is_some);
    if leaf.detailed_metric {
        for (i, (key, value)) in entries.iter().enumerate() {
            match shared.get(i).and_then(Option::as_deref) {
                Some(pattern) => out.push_str(&format!(".{key}_{pattern}")),
                None if any_shared && value.is_empty() => out.push_str(&format!(".{key}")),
                None => out.push_str(&format!(".{key}_{value}")),
            }
        }
        return out;
    }
    for (i, ((key, value), node)) in entries.iter().zip(path).enumerate() {
        let chosen: &str = match (&levels[i], shared[i].as_deref()) {
            (_, Some(pattern)) => pattern,
            (Matched::Wildcard(_), None) if node.value_to_metric => value,
            (Matched::Wildcard(pattern), None) => pattern.strip_prefix(&format!("{key}_")).unwrap_or(pattern),
            (Matched::Exact, None) => value,
            (Matched::Key, None) if node.value_to_metric => value,
            (Matched::Key, None) => "",
        };
        if chosen.is_empty() {
            out.push_str(&format!(".{key}"));
        } else {
            out.push_str(&format!(".{key}_{chosen}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::wildcard_match;

    #[test]
    fn wildcards_match_as_upstreams_do() {
        for (p, t, m) in [
            ("foo*", "foo1", true),
            ("foo*", "foo", true),
            ("foo*", "bar", false),
            ("bar*b", "barab", true),
            ("bar*b", "barb", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("foo*bar*baz", "foo123bar456baz", true),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo123baz", false),
            ("a*a", "a", false),
            ("*", "", true),
            ("x", "x", true),
        ] {
            assert_eq!(wildcard_match(p, t), m, "{p} ~ {t}");
        }
    }
}

//! envoyproxy/ratelimit's YAML configuration, read as upstream reads it: the same keys, the
//! same defaults, the same checks in the same order and the same error messages, each error
//! also naming its line.
//!
//! ```yaml
//! domain: mongo_cps
//! descriptors:
//!   - key: database
//!     value: users
//!     rate_limit:
//!       unit: second
//!       requests_per_unit: 500
//! ```
//!
//! A file holds one domain. A directory is read whole, recursively, each file named by its
//! path below the directory with `/` as `.` (upstream's names: `config/basic.yaml` is
//! `config.basic.yaml`), in name order; two files of one domain are an error unless domains
//! are merged ([`LoadOptions::merge_domains`], upstream's `MERGE_DOMAIN_CONFIG`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode, Node};
use marked_yaml::{LoadError, LoaderOptions};

use crate::yaml::{self, Kind};

/// The keys upstream accepts, at any level of a file (upstream checks one flat list).
const KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // tollgate's own, under `rate_limit` only (see [`Algorithm`]).
    "algorithm",
    "burst",
    "unit_multiplier",
    "count_rejected_hits",
    "lease",
];

/// The keys tollgate adds to upstream's, valid under `rate_limit` only.
const RATE_LIMIT_KEYS: &[&str] = &["algorithm", "burst", "unit_multiplier", "count_rejected_hits", "lease"];

/// A configuration that upstream would refuse, or a file that could not be read: the file's
/// name (as upstream names it), the line where known, and upstream's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, named as upstream names it (see [`Config::from_dir`]).
    pub file: String,
    /// The line (1-based) of the key or value at fault, where there is one.
    pub line: Option<usize>,
    /// Upstream's message, without the file.
    pub message: String,
}

impl ConfigError {
    fn new(file: &str, line: Option<usize>, message: impl Into<String>) -> ConfigError {
        ConfigError { file: file.to_owned(), line, message: message.into() }
    }

    /// The error as upstream words it, `<file>: <message>`, for tools that match on it.
    pub fn upstream(&self) -> String {
        format!("{}: {}", self.file, self.message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A rate limit's unit, with the window it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    /// 7 days.
    Week,
    /// 30 days, as upstream counts a month.
    Month,
    /// 365 days, as upstream counts a year.
    Year,
}

impl Unit {
    /// The unit named `name` in any case (upstream's enum names), or `None`.
    pub fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The window in seconds: windows start at multiples of it since the Unix epoch.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The name in upstream's enum (`SECOND`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// How a rule decides (`rate_limit.algorithm`): upstream's fixed window by default, or one of
/// tollgate's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `fixed_window`: upstream's; windows of the unit (times `unit_multiplier`) aligned on
    /// multiples of it since the Unix epoch.
    #[default]
    FixedWindow,
    /// `token_bucket` (or `gcra`, the same equation): `requests_per_unit` per unit refilled
    /// continuously, up to `burst` at once (default `requests_per_unit`).
    TokenBucket,
    /// `sliding_window`: the current window's count plus the previous window's weighted by how
    /// much of it still overlaps the last unit.
    SlidingWindow,
    /// `nginx`: nginx's `limit_req` with `nodelay` (a service cannot delay a request): `burst`
    /// requests above the rate pass at once, the rest are refused. Units of a second or a
    /// minute only, as nginx's `r/s` and `r/m`.
    Nginx,
}

impl Algorithm {
    /// The algorithm of configuration name `name`.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Some(match name {
            "fixed_window" => Algorithm::FixedWindow,
            "token_bucket" | "gcra" => Algorithm::TokenBucket,
            "sliding_window" => Algorithm::SlidingWindow,
            "nginx" => Algorithm::Nginx,
            _ => return None,
        })
    }

    /// Its configuration name.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Nginx => "nginx",
        }
    }
}

/// A descriptor's `rate_limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// `requests_per_unit` (0 when absent: every hit is over the limit).
    pub requests_per_unit: u32,
    /// `unit`; `None` only for an unlimited one (which must not name a valid unit).
    pub unit: Option<Unit>,
    /// `unlimited`: never limited, never counted.
    pub unlimited: bool,
    /// `name`, which other rules' `replaces` refer to ("" when absent).
    pub name: String,
    /// The names of the rules this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    /// `algorithm` (tollgate's): upstream's fixed window when absent.
    pub algorithm: Algorithm,
    /// `burst` (tollgate's): the token bucket's capacity, nginx's `burst=`; `None` when absent.
    pub burst: Option<u32>,
    /// `unit_multiplier` (tollgate's): the window (or the token bucket's period) is this many
    /// units; 1 when absent.
    pub unit_multiplier: u32,
    /// `count_rejected_hits` (tollgate's): whether hits over the limit count in the window, as
    /// upstream's `INCRBY` counts them. True for the fixed window when absent (upstream's
    /// verdicts); only the fixed window can count them.
    pub count_rejected_hits: bool,
    /// `lease` (tollgate's): on the Redis backend, each instance takes a hot value's units in
    /// batches of up to a tenth of the limit and spends them locally ([`RateLimit::max_lease`]);
    /// never more than the limit per window, fleet-wide. A leased window does not count
    /// rejected hits. No effect on the embedded backend.
    pub lease: bool,
}

impl RateLimit {
    /// The window, or the token bucket's period: the unit times `unit_multiplier` (`None` for
    /// an unlimited rule).
    pub fn window(&self) -> Option<std::time::Duration> {
        let unit = self.unit?;
        Some(std::time::Duration::from_secs(unit.seconds().saturating_mul(u64::from(self.unit_multiplier))))
    }

    /// The largest lease, in hits: a tenth of `requests_per_unit` (at least 1) when the rule
    /// leases, else 0.
    pub fn max_lease(&self) -> u64 {
        if self.lease {
            u64::from(self.requests_per_unit / 10).max(1)
        } else {
            0
        }
    }

    /// Whether the rule decides as upstream's does: a fixed window that counts rejected hits.
    pub fn counts_rejected(&self) -> bool {
        self.algorithm == Algorithm::FixedWindow && self.count_rejected_hits
    }
}

/// A value of a descriptor's `metadata`, kept for the response's dynamic metadata.
#[derive(Clone, Debug, PartialEq)]
pub enum Metadata {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    List(Vec<Metadata>),
    Struct(Vec<(String, Metadata)>),
}

/// One descriptor of the tree: its key and value, its limit, its flags and its children.
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// `key`.
    pub key: String,
    /// `value` ("" when absent: the descriptor matches any value of its key).
    pub value: String,
    /// `key`, or `key_value` when it has a value: its name among its siblings.
    pub composite: String,
    /// The dotted path from the domain (`domain.key1_value1.key2`): the statistics' name.
    pub full_key: String,
    /// `rate_limit`.
    pub rate_limit: Option<RateLimit>,
    /// `shadow_mode`: over the limit is answered OK (and counted as shadow).
    pub shadow_mode: bool,
    /// `quota_mode`.
    pub quota_mode: bool,
    /// `detailed_metric`: statistics under the request's values.
    pub detailed_metric: bool,
    /// `value_to_metric`: this level's statistics under the request's value.
    pub value_to_metric: bool,
    /// `share_threshold`: every value the wildcard matches shares one counter.
    pub share_threshold: bool,
    /// `metadata`.
    pub metadata: Option<Metadata>,
    /// The line of its `key`.
    pub line: Option<usize>,
    pub(crate) children: Children,
    /// Its place in its configuration, from 0 in a depth-first walk: where the service keeps
    /// its table and counts (numbered when the configuration is complete).
    pub(crate) index: usize,
    /// The children's composite keys that hold a `*`, in file order.
    pub(crate) wildcards: Vec<String>,
}

impl Descriptor {
    /// The child of composite key `composite`.
    pub fn child(&self, composite: &str) -> Option<&Descriptor> {
        self.children.get(composite)
    }

    /// The children, in no particular order.
    pub fn children(&self) -> impl Iterator<Item = &Descriptor> {
        self.children.values()
    }

    fn root(domain: &str) -> Descriptor {
        Descriptor {
            key: String::new(),
            value: String::new(),
            composite: String::new(),
            full_key: domain.to_owned(),
            rate_limit: None,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            metadata: None,
            line: None,
            children: Children::default(),
            index: 0,
            wildcards: Vec::new(),
        }
    }
}

/// A descriptor's children by composite key, on ahash: every request walks them.
pub(crate) type Children = std::collections::HashMap<String, Descriptor, ahash::RandomState>;

/// A domain: its descriptors' tree.
#[derive(Clone, Debug)]
pub struct Domain {
    /// `domain`.
    pub name: String,
    /// The file it came from (the first, when merged).
    pub file: String,
    pub(crate) root: Descriptor,
}

impl Domain {
    /// The top-level descriptor of composite key `composite`.
    pub fn descriptor(&self, composite: &str) -> Option<&Descriptor> {
        self.root.children.get(composite)
    }
}

/// How a configuration is read.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Two files of one domain add up to one domain instead of being refused (upstream's
    /// `MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// Files and directories whose name starts with `.` are skipped (upstream's
    /// `RUNTIME_IGNOREDOTFILES`; upstream reads them by default, and so does this).
    pub ignore_dotfiles: bool,
}

/// Every domain of a configuration.
#[derive(Clone, Debug, Default)]
pub struct Config {
    domains: BTreeMap<String, Domain>,
    /// Descriptors, roots included.
    descriptors: usize,
}

impl Config {
    /// A configuration from files' contents, each named as errors should name it, in order.
    pub fn from_files<N, C>(
        files: impl IntoIterator<Item = (N, C)>,
        options: LoadOptions,
    ) -> Result<Config, ConfigError>
    where
        N: AsRef<str>,
        C: AsRef<str>,
    {
        let mut config = Config::default();
        for (name, contents) in files {
            config.add_file(name.as_ref(), contents.as_ref(), options)?;
        }
        config.number();
        Ok(config)
    }

    /// One file, named by its file name.
    pub fn from_file(path: &Path, options: LoadOptions) -> Result<Config, ConfigError> {
        let name =
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let contents = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(&name, None, format!("error loading config file: {e}")))?;
        Config::from_files([(name, contents)], options)
    }

    /// Every file below `dir`, recursively, each named by its path below `dir` with `/` as
    /// `.`, read in name order.
    pub fn from_dir(dir: &Path, options: LoadOptions) -> Result<Config, ConfigError> {
        let mut files = Vec::new();
        walk(dir, "", options, &mut files)?;
        files.sort();
        let mut config = Config::default();
        for (name, path) in files {
            let contents = std::fs::read_to_string(&path)
                .map_err(|e| ConfigError::new(&name, None, format!("error loading config file: {e}")))?;
            config.add_file(&name, &contents, options)?;
        }
        config.number();
        Ok(config)
    }

    /// Numbers every descriptor (roots included), from 0, depth first.
    fn number(&mut self) {
        fn walk(node: &mut Descriptor, next: &mut usize) {
            node.index = *next;
            *next += 1;
            for child in node.children.values_mut() {
                walk(child, next);
            }
        }
        let mut next = 0;
        for domain in self.domains.values_mut() {
            walk(&mut domain.root, &mut next);
        }
        self.descriptors = next;
    }

    /// How many descriptors the configuration has, roots included (one more than the largest
    /// `index`).
    pub(crate) fn descriptor_count(&self) -> usize {
        self.descriptors
    }

    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, by name.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    fn add_file(&mut self, file: &str, contents: &str, options: LoadOptions) -> Result<(), ConfigError> {
        self.add_parsed(file, contents, options).map_err(|mut e| {
            // The scanner can place a mark one line past the input's last (an empty scalar, an
            // error at the end): name the last line instead.
            let last = contents.matches(['\n', '\r']).count().max(1);
            e.line = e.line.map(|l| l.min(last));
            e
        })
    }

    fn add_parsed(&mut self, file: &str, contents: &str, options: LoadOptions) -> Result<(), ConfigError> {
        let root = parse(file, contents)?;
        validate_keys(file, &root, false)?;
        let domain_node = root.get_node("domain");
        let domain = match domain_node {
            Some(node) => string_field(file, node, "domain")?,
            None => String::new(),
        };
        if domain.is_empty() {
            return Err(ConfigError::new(
                file,
                key_line(&root, "domain"),
                "config file cannot have empty domain",
            ));
        }
        let descriptors = match root.get_node("descriptors") {
            Some(node) => list_field(file, node)?,
            None => Vec::new(),
        };
        if let Some(existing) = self.domains.get_mut(&domain) {
            if !options.merge_domains {
                return Err(ConfigError::new(
                    file,
                    key_line(&root, "domain"),
                    format!("duplicate domain '{domain}' in config file"),
                ));
            }
            return load_descriptors(file, &format!("{domain}."), &descriptors, &mut existing.root);
        }
        let mut tree = Descriptor::root(&domain);
        load_descriptors(file, &format!("{domain}."), &descriptors, &mut tree)?;
        self.domains.insert(domain.clone(), Domain { name: domain, file: file.to_owned(), root: tree });
        Ok(())
    }
}

/// The files below `dir` as (upstream's name, path).
fn walk(
    dir: &Path,
    prefix: &str,
    options: LoadOptions,
    out: &mut Vec<(String, std::path::PathBuf)>,
) -> Result<(), ConfigError> {
    let name_of_dir =
        if prefix.is_empty() { dir.display().to_string() } else { prefix.trim_end_matches('.').to_owned() };
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(&name_of_dir, None, format!("error loading config directory: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| {
            ConfigError::new(&name_of_dir, None, format!("error loading config directory: {e}"))
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if options.ignore_dotfiles && name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let full = format!("{prefix}{name}");
        // Follows symbolic links, as upstream's runtime loader does.
        let meta = std::fs::metadata(&path)
            .map_err(|e| ConfigError::new(&full, None, format!("error loading config file: {e}")))?;
        if meta.is_dir() {
            walk(&path, &format!("{full}."), options, out)?;
        } else if meta.is_file() {
            out.push((full, path));
        }
    }
    Ok(())
}

/// The file's first document, a mapping (an empty file is an empty mapping).
fn parse(file: &str, contents: &str) -> Result<MarkedMappingNode, ConfigError> {
    let only_comments = contents.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || t == "---" || t == "..."
    });
    if only_comments {
        return Ok(MarkedMappingNode::new_empty(marked_yaml::Span::new_blank()));
    }
    // With coercion "prevented", a scalar records whether it was plain: only plain ones are
    // numbers, booleans or null, as in go-yaml.
    let options = LoaderOptions::default().error_on_duplicate_keys(true).prevent_coercion(true);
    let node =
        marked_yaml::parse_yaml_with_options(0, contents, options).map_err(|e| load_error(file, &e))?;
    match node {
        Node::Mapping(map) => Ok(map),
        other => Err(ConfigError::new(
            file,
            yaml::line(&other),
            "error loading config file: the file must be a mapping (domain, descriptors)",
        )),
    }
}

fn load_error(file: &str, e: &LoadError) -> ConfigError {
    let (line, what) = match e {
        LoadError::TopLevelMustBeMapping(m) => {
            (Some(m.line()), "the file must be a mapping (domain, descriptors)".to_owned())
        }
        LoadError::TopLevelMustBeSequence(m) => {
            (Some(m.line()), "a list where a mapping was expected".to_owned())
        }
        LoadError::UnexpectedAnchor(m) => {
            (Some(m.line()), "anchors and aliases are not supported".to_owned())
        }
        LoadError::MappingKeyMustBeScalar(m) => (Some(m.line()), "a mapping key must be a scalar".to_owned()),
        LoadError::UnexpectedTag(m) => (Some(m.line()), "explicit tags are not supported".to_owned()),
        LoadError::ScanError(m, e) => (Some(m.line()), format!("yaml: {}", e.info())),
        LoadError::DuplicateKey(d) => (
            yaml::scalar_line(&d.key),
            format!(
                "key {:?} already set in map (first on line {})",
                d.key.as_str(),
                yaml::scalar_line(&d.prev_key).unwrap_or(0)
            ),
        ),
    };
    ConfigError::new(file, line, format!("error loading config file: {what}"))
}

/// Upstream's first pass: every key a string in [`KEYS`] (anything under `metadata`
/// excepted), every list of mappings, no floats.
fn validate_keys(file: &str, map: &MarkedMappingNode, in_rate_limit: bool) -> Result<(), ConfigError> {
    for (key, value) in map.iter() {
        let line = yaml::scalar_line(key);
        if !matches!(yaml::scalar_kind(key), Kind::Str) {
            return Err(ConfigError::new(
                file,
                line,
                format!("config error, key is not of type string: {}", key.as_str()),
            ));
        }
        if !KEYS.contains(&key.as_str()) {
            return Err(ConfigError::new(
                file,
                line,
                format!("config error, unknown key '{}'", key.as_str()),
            ));
        }
        if !in_rate_limit && RATE_LIMIT_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::new(
                file,
                line,
                format!("config error, key '{}' belongs under rate_limit", key.as_str()),
            ));
        }
        if key.as_str() == "metadata" {
            continue;
        }
        if key.as_str() == "rate_limit" {
            if let Node::Mapping(limit) = value {
                validate_keys(file, limit, true)?;
                continue;
            }
        }
        validate_value(file, value)?;
    }
    Ok(())
}

fn validate_value(file: &str, value: &Node) -> Result<(), ConfigError> {
    match value {
        Node::Mapping(map) => validate_keys(file, map, false),
        Node::Sequence(items) => {
            for item in items.iter() {
                match item {
                    Node::Mapping(map) => validate_keys(file, map, false)?,
                    other => {
                        return Err(ConfigError::new(
                            file,
                            yaml::line(other),
                            format!(
                                "config error, yaml file contains list of type other than map: {}",
                                yaml::render(other)
                            ),
                        ))
                    }
                }
            }
            Ok(())
        }
        Node::Scalar(s) => match yaml::scalar_kind(s) {
            Kind::Float => Err(ConfigError::new(file, yaml::scalar_line(s), "error checking config")),
            _ => Ok(()),
        },
    }
}

/// go-yaml v2's message for a value of the wrong type.
fn unmarshal_error(file: &str, node: &Node, into: &str) -> ConfigError {
    let what = match node {
        Node::Scalar(s) => format!("{} `{}`", yaml::scalar_kind(s).tag(), s.as_str()),
        Node::Sequence(_) => "!!seq".to_owned(),
        Node::Mapping(_) => "!!map".to_owned(),
    };
    let line = yaml::line(node);
    ConfigError::new(
        file,
        line,
        format!(
            "error loading config file: yaml: unmarshal errors:\n  line {}: cannot unmarshal {what} into {into}",
            line.unwrap_or(0)
        ),
    )
}

/// A string field: any scalar's text (numbers and booleans as written), "" for null.
fn string_field(file: &str, node: &Node, _name: &str) -> Result<String, ConfigError> {
    match node {
        Node::Scalar(s) => Ok(match yaml::scalar_kind(s) {
            Kind::Null => String::new(),
            _ => s.as_str().to_owned(),
        }),
        other => Err(unmarshal_error(file, other, "string")),
    }
}

fn bool_field(file: &str, node: &Node) -> Result<bool, ConfigError> {
    match node {
        Node::Scalar(s) => match yaml::scalar_kind(s) {
            Kind::Bool(b) => Ok(b),
            Kind::Null => Ok(false),
            _ => Err(unmarshal_error(file, node, "bool")),
        },
        other => Err(unmarshal_error(file, other, "bool")),
    }
}

fn u32_field(file: &str, node: &Node) -> Result<u32, ConfigError> {
    match node {
        Node::Scalar(s) => match yaml::scalar_kind(s) {
            Kind::Int(Some(v)) => u32::try_from(v).map_err(|_| unmarshal_error(file, node, "uint32")),
            Kind::Null => Ok(0),
            _ => Err(unmarshal_error(file, node, "uint32")),
        },
        other => Err(unmarshal_error(file, other, "uint32")),
    }
}

/// A list of mappings (null: empty).
fn list_field<'n>(file: &str, node: &'n Node) -> Result<Vec<&'n MarkedMappingNode>, ConfigError> {
    match node {
        Node::Sequence(items) => items
            .iter()
            .map(|item| item.as_mapping().ok_or_else(|| unmarshal_error(file, item, "config.YamlDescriptor")))
            .collect(),
        Node::Scalar(s) if matches!(yaml::scalar_kind(s), Kind::Null) => Ok(Vec::new()),
        other => Err(unmarshal_error(file, other, "[]config.YamlDescriptor")),
    }
}

fn field<'a>(map: &'a MarkedMappingNode, name: &str) -> Option<&'a Node> {
    map.get_node(name)
}

fn key_line(map: &MarkedMappingNode, name: &str) -> Option<usize> {
    map.keys().find(|k| k.as_str() == name).and_then(yaml::scalar_line)
}

/// Upstream's second pass over one level: each descriptor checked and added under `parent`.
fn load_descriptors(
    file: &str,
    parent_key: &str,
    descriptors: &[&MarkedMappingNode],
    parent: &mut Descriptor,
) -> Result<(), ConfigError> {
    for map in descriptors {
        let line = key_line(map, "key").or_else(|| map.span().start().map(marked_yaml::Marker::line));
        let text = |name: &str| field(map, name).map(|n| string_field(file, n, name)).transpose();
        let flag = |name: &str| {
            field(map, name).map(|n| bool_field(file, n)).transpose().map(Option::unwrap_or_default)
        };
        let key = text("key")?.unwrap_or_default();
        let value = text("value")?.unwrap_or_default();
        let shadow_mode = flag("shadow_mode")?;
        let quota_mode = flag("quota_mode")?;
        let detailed_metric = flag("detailed_metric")?;
        let value_to_metric = flag("value_to_metric")?;
        let share_threshold = flag("share_threshold")?;
        if key.is_empty() {
            return Err(ConfigError::new(file, line, "descriptor has empty key"));
        }
        let composite = if value.is_empty() { key.clone() } else { format!("{key}_{value}") };
        let full_key = format!("{parent_key}{composite}");
        if parent.children.contains_key(&composite) {
            return Err(ConfigError::new(
                file,
                line,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        let rate_limit = match field(map, "rate_limit") {
            Some(node) => rate_limit(file, node)?,
            None => None,
        };
        if share_threshold && !composite.contains('*') {
            return Err(ConfigError::new(
                file,
                key_line(map, "share_threshold").or(line),
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"
                ),
            ));
        }
        let metadata = field(map, "metadata").map(metadata);
        let mut node = Descriptor {
            key,
            value,
            composite: composite.clone(),
            full_key: full_key.clone(),
            rate_limit,
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric,
            share_threshold,
            metadata,
            line,
            children: Children::default(),
            index: 0,
            wildcards: Vec::new(),
        };
        if let Some(children) = field(map, "descriptors") {
            let children = list_field(file, children)?;
            load_descriptors(file, &format!("{full_key}."), &children, &mut node)?;
        }
        if composite.contains('*') {
            parent.wildcards.push(composite.clone());
        }
        parent.children.insert(composite, node);
    }
    Ok(())
}

/// A `rate_limit` mapping, checked as upstream checks it (null: none).
fn rate_limit(file: &str, node: &Node) -> Result<Option<RateLimit>, ConfigError> {
    let map = match node {
        Node::Mapping(map) => map,
        Node::Scalar(s) if matches!(yaml::scalar_kind(s), Kind::Null) => return Ok(None),
        other => return Err(unmarshal_error(file, other, "config.YamlRateLimit")),
    };
    let unlimited = field(map, "unlimited").map(|n| bool_field(file, n)).transpose()?.unwrap_or(false);
    let requests_per_unit =
        field(map, "requests_per_unit").map(|n| u32_field(file, n)).transpose()?.unwrap_or(0);
    let name = field(map, "name").map(|n| string_field(file, n, "name")).transpose()?.unwrap_or_default();
    let unit_text =
        field(map, "unit").map(|n| string_field(file, n, "unit")).transpose()?.unwrap_or_default();
    let unit_line = key_line(map, "unit").or_else(|| map.span().start().map(marked_yaml::Marker::line));
    let unit = Unit::parse(&unit_text);
    let unit = match (unlimited, unit) {
        (true, Some(_)) => {
            return Err(ConfigError::new(
                file,
                unit_line,
                "should not specify rate limit unit when unlimited",
            ))
        }
        (true, None) => None,
        (false, Some(unit)) => Some(unit),
        (false, None) => {
            return Err(ConfigError::new(file, unit_line, format!("invalid rate limit unit '{unit_text}'")))
        }
    };
    let mut replaces = Vec::new();
    if let Some(list) = field(map, "replaces") {
        for entry in list_field(file, list)? {
            let entry_line =
                entry.span().start().map(marked_yaml::Marker::line).or(key_line(map, "replaces"));
            let replaced =
                field(entry, "name").map(|n| string_field(file, n, "name")).transpose()?.unwrap_or_default();
            if replaced.is_empty() {
                return Err(ConfigError::new(file, entry_line, "should not have an empty replaces entry"));
            }
            if replaced == name {
                return Err(ConfigError::new(
                    file,
                    entry_line,
                    "replaces should not contain name of same descriptor",
                ));
            }
            replaces.push(replaced);
        }
    }
    // tollgate's options, checked after upstream's so that upstream's files fail as upstream's.
    let line_of = |key: &str| key_line(map, key).or(unit_line);
    if let Some(key) = RATE_LIMIT_KEYS.iter().find(|k| unlimited && field(map, k).is_some()) {
        return Err(ConfigError::new(file, line_of(key), format!("should not specify {key} when unlimited")));
    }
    let algorithm_text = field(map, "algorithm").map(|n| string_field(file, n, "algorithm")).transpose()?;
    let algorithm = match algorithm_text.as_deref() {
        None => Algorithm::FixedWindow,
        Some(text) => Algorithm::parse(text).ok_or_else(|| {
            ConfigError::new(
                file,
                line_of("algorithm"),
                format!(
                    "invalid rate limit algorithm '{text}' (one of fixed_window, token_bucket, gcra, sliding_window, nginx)"
                ),
            )
        })?,
    };
    let burst = field(map, "burst").map(|n| u32_field(file, n)).transpose()?;
    if burst.is_some() && !matches!(algorithm, Algorithm::TokenBucket | Algorithm::Nginx) {
        return Err(ConfigError::new(
            file,
            line_of("burst"),
            format!("burst applies to token_bucket, gcra and nginx, not {}", algorithm.name()),
        ));
    }
    let unit_multiplier = field(map, "unit_multiplier").map(|n| u32_field(file, n)).transpose()?.unwrap_or(1);
    if unit_multiplier == 0 {
        return Err(ConfigError::new(file, line_of("unit_multiplier"), "unit_multiplier must be at least 1"));
    }
    let count_rejected_hits = field(map, "count_rejected_hits").map(|n| bool_field(file, n)).transpose()?;
    if count_rejected_hits == Some(true) && algorithm != Algorithm::FixedWindow {
        return Err(ConfigError::new(
            file,
            line_of("count_rejected_hits"),
            format!("count_rejected_hits applies to fixed_window only, not {}", algorithm.name()),
        ));
    }
    let lease = field(map, "lease").map(|n| bool_field(file, n)).transpose()?.unwrap_or(false);
    if lease && algorithm != Algorithm::FixedWindow {
        return Err(ConfigError::new(
            file,
            line_of("lease"),
            format!("lease applies to fixed_window only, not {}", algorithm.name()),
        ));
    }
    if lease && count_rejected_hits == Some(true) {
        return Err(ConfigError::new(
            file,
            line_of("lease"),
            "a leased window cannot count rejected hits (a refusal is decided from the lease, without Redis): set count_rejected_hits: false or drop it",
        ));
    }
    if algorithm == Algorithm::Nginx
        && (unit_multiplier != 1 || !matches!(unit, Some(Unit::Second | Unit::Minute)))
    {
        return Err(ConfigError::new(
            file,
            line_of("algorithm"),
            "nginx's rate is per second or per minute: unit second or minute, unit_multiplier 1",
        ));
    }
    Ok(Some(RateLimit {
        requests_per_unit,
        unit,
        unlimited,
        name,
        replaces,
        algorithm,
        burst,
        unit_multiplier,
        count_rejected_hits: count_rejected_hits.unwrap_or(algorithm == Algorithm::FixedWindow && !lease),
        lease,
    }))
}

/// `metadata` as values (numbers as upstream's `Struct` holds them, as doubles).
fn metadata(node: &Node) -> Metadata {
    match node {
        Node::Scalar(s) => scalar_metadata(s),
        Node::Sequence(items) => Metadata::List(items.iter().map(metadata).collect()),
        Node::Mapping(map) => {
            Metadata::Struct(map.iter().map(|(k, v)| (k.as_str().to_owned(), metadata(v))).collect())
        }
    }
}

fn scalar_metadata(s: &MarkedScalarNode) -> Metadata {
    match yaml::scalar_kind(s) {
        Kind::Null => Metadata::Null,
        Kind::Bool(b) => Metadata::Bool(b),
        Kind::Int(_) | Kind::Float => s
            .as_str()
            .replace('_', "")
            .parse::<f64>()
            .map_or_else(|_| Metadata::String(s.as_str().to_owned()), Metadata::Number),
        Kind::Str => Metadata::String(s.as_str().to_owned()),
    }
}

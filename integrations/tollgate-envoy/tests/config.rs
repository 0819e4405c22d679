//! envoyproxy/ratelimit's configuration corpus (its `test/config/` files and the expectations
//! of its `config_test.go`), as black-box tests of this loader: every bad file refused with
//! upstream's message, every good one matched as upstream matches it, statistics named as
//! upstream names them.

use std::path::{Path, PathBuf};

use tollgate_envoy::{Config, ConfigError, LoadOptions, Matched, Metadata, Unit};

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config").join(name)
}

fn load(names: &[&str], merge: bool) -> Result<Config, ConfigError> {
    let files: Vec<(String, String)> = names
        .iter()
        .map(|n| ((*n).to_owned(), std::fs::read_to_string(corpus(n)).expect("corpus file")))
        .collect();
    Config::from_files(files, LoadOptions { merge_domains: merge, ..LoadOptions::default() })
}

fn refused(name: &str) -> ConfigError {
    load(&[name], false).expect_err(name)
}

#[test]
fn bad_files_are_refused_with_upstreams_messages_and_their_lines() {
    for (file, message, line) in [
        ("bad_limit_unit.yaml", "bad_limit_unit.yaml: invalid rate limit unit 'foo'", Some(6)),
        (
            "duplicate_key.yaml",
            "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
            Some(6),
        ),
        ("empty_domain.yaml", "empty_domain.yaml: config file cannot have empty domain", None),
        ("empty_key.yaml", "empty_key.yaml: descriptor has empty key", Some(3)),
        ("misspelled_key.yaml", "misspelled_key.yaml: config error, unknown key 'ratelimit'", Some(5)),
        (
            "misspelled_key2.yaml",
            "misspelled_key2.yaml: config error, unknown key 'requestsperunit'",
            Some(7),
        ),
        (
            "non_map_list.yaml",
            "non_map_list.yaml: config error, yaml file contains list of type other than map: a",
            Some(3),
        ),
        (
            "non_string_key.yaml",
            "non_string_key.yaml: config error, key is not of type string: 0.25",
            Some(1),
        ),
        ("replaces_empty.yaml", "replaces_empty.yaml: should not have an empty replaces entry", Some(10)),
        (
            "replaces_self.yaml",
            "replaces_self.yaml: replaces should not contain name of same descriptor",
            Some(10),
        ),
        (
            "unlimited_with_unit.yaml",
            "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited",
            Some(6),
        ),
    ] {
        let e = refused(file);
        assert_eq!(e.upstream(), message, "{file}");
        assert_eq!(e.line, line, "{file}: {e}");
        // The display names the line, as a compiler does.
        if let Some(line) = line {
            assert!(e.to_string().starts_with(&format!("{file}:{line}: ")), "{e}");
        }
    }
    // go-yaml's own wording of a syntax error cannot be matched; its prefix is upstream's.
    let e = refused("bad_yaml.yaml");
    assert!(e.upstream().starts_with("bad_yaml.yaml: error loading config file: "), "{e}");
}

#[test]
fn a_domain_in_two_files_is_refused_unless_merged() {
    let e = load(&["basic_config.yaml", "duplicate_domain.yaml"], false).unwrap_err();
    assert_eq!(e.upstream(), "duplicate_domain.yaml: duplicate domain 'test-domain' in config file");
    let merged = load(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], true).unwrap();
    let d = merged.domain("test-domain").unwrap();
    let limit = |k, v| d.find(&[(k, v)]).map(|f| f.descriptor.rate_limit.clone().unwrap().requests_per_unit);
    assert_eq!((limit("key1", "value1"), limit("key2", "value2")), (Some(10), Some(20)));
    assert!(d.find(&[]).is_none());
    let e = load(&["merge_domain_key1.yaml", "merge_domain_key1.yaml"], true).unwrap_err();
    assert_eq!(
        e.upstream(),
        "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"
    );
}

/// `(requests_per_unit, unit, name, statistics key)` of a request's rule, or `None`.
fn rule(
    config: &Config,
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<(u32, Option<Unit>, String, String)> {
    let found = config.domain(domain)?.find(entries)?;
    let r = found.descriptor.rate_limit.clone().unwrap();
    Some((r.requests_per_unit, r.unit, r.name, found.stats_key))
}

#[test]
fn the_basic_configuration_matches_as_upstreams_tests_expect() {
    let c = load(&["basic_config.yaml"], false).unwrap();
    let r = |entries: &[(&str, &str)]| rule(&c, "test-domain", entries);
    let s = |n, u, key: &str| Some((n, Some(u), String::new(), key.to_owned()));
    assert!(c.domain("foo_domain").is_none());
    assert_eq!(r(&[]), None);
    assert_eq!(r(&[("key1", "something")]), None);
    assert_eq!(r(&[("key1", "value1")]), None, "no limit at that level");
    assert_eq!(r(&[("key2", "value2"), ("subkey", "subvalue")]), None, "depth mismatch");
    assert_eq!(r(&[("key5", "value5"), ("subkey5", "subvalue")]), None);
    assert_eq!(
        r(&[("key1", "value1"), ("subkey1", "something")]),
        s(5, Unit::Second, "test-domain.key1_value1.subkey1")
    );
    assert_eq!(
        r(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        s(10, Unit::Second, "test-domain.key1_value1.subkey1_subvalue1")
    );
    assert_eq!(r(&[("key2", "something")]), s(20, Unit::Minute, "test-domain.key2"));
    assert_eq!(r(&[("key2", "value2")]), s(30, Unit::Minute, "test-domain.key2_value2"));
    assert_eq!(r(&[("key2", "value3")]), None, "whitelisted: matched, no limit");
    assert_eq!(r(&[("key3", "foo")]), s(1, Unit::Hour, "test-domain.key3"));
    assert_eq!(
        r(&[("key4", "foo")]),
        Some((1, Some(Unit::Day), "key4_rate_limit".to_owned(), "test-domain.key4".to_owned()))
    );
    let unlimited = c.domain("test-domain").unwrap().find(&[("key6", "foo")]).unwrap();
    assert!(unlimited.descriptor.rate_limit.as_ref().unwrap().unlimited);
    assert_eq!(unlimited.stats_key, "test-domain.key6");
    assert_eq!(
        r(&[("key7", "unspecified_value")]),
        s(70, Unit::Minute, "test-domain.key7_unspecified_value")
    );
    assert_eq!(r(&[("key7", "another_value")]), s(70, Unit::Minute, "test-domain.key7_another_value"));
    assert_eq!(
        r(&[("key5", "value5"), ("subkey5", "subvalue5")]),
        s(25, Unit::Day, "test-domain.key5_value5.subkey5_subvalue5")
    );
}

#[test]
fn shadow_mode_belongs_to_its_own_descriptor() {
    let c = load(&["shadowmode_config.yaml"], false).unwrap();
    let d = c.domain("test-domain").unwrap();
    let shadow = |e: &[(&str, &str)]| {
        d.find(e)
            .map(|f| (f.descriptor.rate_limit.clone().unwrap().requests_per_unit, f.descriptor.shadow_mode))
    };
    assert_eq!(shadow(&[("key1", "value1"), ("subkey1", "something")]), Some((5, false)));
    assert_eq!(shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]), Some((10, true)));
    assert_eq!(shadow(&[("key2", "something")]), Some((20, true)));
    assert_eq!(shadow(&[("key2", "value2")]), Some((30, false)));
}

#[test]
fn wildcards_match_prefixes_middles_and_several_stars() {
    let c = load(&["wildcard.yaml"], false).unwrap();
    let key = |e: &[(&str, &str)]| rule(&c, "test-domain", e).map(|r| r.3);
    assert_eq!(key(&[("noVal", "foo1")]).as_deref(), Some("test-domain.noVal"));
    assert_eq!(key(&[("noVal", "foo2")]).as_deref(), Some("test-domain.noVal"));
    assert_eq!(key(&[("wild", "foo1")]).as_deref(), Some("test-domain.wild_foo*"));
    assert_eq!(key(&[("wild", "foo2")]).as_deref(), Some("test-domain.wild_foo*"));
    assert_eq!(
        key(&[("nestedWild", "val1"), ("wild", "goo2")]).as_deref(),
        Some("test-domain.nestedWild_val1.wild_goo*")
    );
    assert_eq!(key(&[("wild", "bar")]), None);
    assert_eq!(key(&[("noWild", "foo1")]), None);
    for v in ["barab", "bar123b", "barb"] {
        assert_eq!(key(&[("midWild", v)]).as_deref(), Some("test-domain.midWild_bar*b"), "{v}");
    }
    for v in ["bara", "xbarb"] {
        assert_eq!(key(&[("midWild", v)]), None, "{v}");
    }
    for v in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(key(&[("multiWild", v)]).as_deref(), Some("test-domain.multiWild_foo*bar*baz"), "{v}");
    }
    for v in ["foo123baz", "bar456baz"] {
        assert_eq!(key(&[("multiWild", v)]), None, "{v}");
    }
    let found = c.domain("test-domain").unwrap().find(&[("wild", "foo7")]).unwrap();
    assert_eq!(found.levels, [Matched::Wildcard("wild_foo*".into())]);
}

#[test]
fn shared_thresholds_count_by_pattern_and_name_statistics_as_upstream() {
    let c = load(&["share_threshold.yaml"], false).unwrap();
    let d = c.domain("test-domain").unwrap();
    let check = |entries: &[(&str, &str)], limit: u32, shared: &[Option<&str>], key: &str| {
        let f = d.find(entries).unwrap_or_else(|| panic!("{entries:?}"));
        assert_eq!(f.descriptor.rate_limit.as_ref().unwrap().requests_per_unit, limit, "{entries:?}");
        let got: Vec<Option<&str>> = f.shared.iter().map(Option::as_deref).collect();
        assert_eq!(got, shared, "{entries:?}");
        assert_eq!(f.stats_key, key, "{entries:?}");
    };
    for v in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        check(&[("files", v)], 100, &[Some("files/*")], "test-domain.files_files/*");
    }
    check(
        &[("route", "api/v1"), ("method", "GET")],
        60,
        &[Some("api/*"), None],
        "test-domain.route_api/*.method",
    );
    check(
        &[("service", "svc/user"), ("endpoint", "get")],
        80,
        &[Some("svc/*"), None],
        "test-domain.service_svc/*.endpoint_get",
    );
    check(
        &[("nested", "parent"), ("files", "nested/file1.txt")],
        200,
        &[None, Some("nested/*")],
        "test-domain.nested_parent.files_nested/*",
    );
    check(
        &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
        300,
        &[Some("top/*"), Some("nested/*")],
        "test-domain.files_top/*.files_nested/*",
    );
    check(
        &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
        120,
        &[Some("path/*"), None, None],
        "test-domain.path_path/*.file_file/*.type",
    );
    check(
        &[("user", "user/alice"), ("resource", "res/file1"), ("action", "read")],
        150,
        &[Some("user/*"), Some("res/*"), None],
        "test-domain.user_user/*.resource_res/*.action",
    );
    check(&[("file", "test1")], 50, &[None], "test-domain.file_test1");
    for v in ["test2", "test23", "test123"] {
        check(&[("file", v)], 100, &[Some("test*")], "test-domain.file_test*");
    }
    for v in ["/api/v1", "/api-beta-v1", "/apiXYZv1"] {
        check(&[("midpath", v)], 100, &[Some("/api*v1")], "test-domain.midpath_/api*v1");
    }
    assert!(d.find(&[("midpath", "/api/v2")]).is_none());
    for v in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"] {
        check(&[("multiroute", v)], 50, &[Some("svc*ep*rpc")], "test-domain.multiroute_svc*ep*rpc");
    }
    assert!(d.find(&[("multiroute", "svcABCrpc")]).is_none());
    for v in ["/api/v2", "/api-beta-v2"] {
        check(&[("midroute", v)], 80, &[Some("/api*v2")], "test-domain.midroute_/api*v2");
    }
    for (t, r) in [("t1prod", "resAv2"), ("t99prod", "resBBBv2")] {
        check(
            &[("tenant", t), ("resource", r)],
            60,
            &[Some("t*prod"), Some("res*v2")],
            "test-domain.tenant_t*prod.resource_res*v2",
        );
    }
}

#[test]
fn metadata_is_kept_for_the_response() {
    let c = load(&["metadata.yaml"], false).unwrap();
    let d = c.domain("test-domain").unwrap();
    let m = d.find(&[("key1", "value1"), ("subkey1", "something")]).unwrap().descriptor.metadata.clone();
    assert_eq!(m, Some(Metadata::Struct(vec![("name".into(), Metadata::String("service_1".into()))])));
    // Upstream's file has a specific override beside it: 10 a second, no metadata.
    let found = d.find(&[("key1", "value1"), ("subkey1", "subvalue1")]).unwrap();
    assert_eq!(found.descriptor.rate_limit.as_ref().unwrap().requests_per_unit, 10);
    assert_eq!(found.descriptor.metadata, None);
    assert_eq!(found.stats_key, "test-domain.key1_value1.subkey1_subvalue1");
    let m = d.find(&[("key2", "something")]).unwrap().descriptor.metadata.clone();
    assert_eq!(
        m,
        Some(Metadata::Struct(vec![(
            "service_with_quota".into(),
            Metadata::Struct(vec![("name".into(), Metadata::String("service_2".into()))])
        )]))
    );
}

fn inline(yaml: &str) -> Config {
    Config::from_files([("inline.yaml", yaml)], LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn stats_key(config: &Config, domain: &str, entries: &[(&str, &str)]) -> String {
    config.domain(domain).unwrap().find(entries).unwrap().stats_key
}

#[test]
fn detailed_metric_names_the_requests_values() {
    let config = |outer: bool, inner: bool| {
        inline(&format!(
            "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {outer}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      - key: key-2\n        detailed_metric: {inner}\n        rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        ))
    };
    assert_eq!(stats_key(&config(true, false), "nested", &[("key-1", "value-1")]), "nested.key-1_value-1");
    assert_eq!(stats_key(&config(false, false), "nested", &[("key-1", "value-1")]), "nested.key-1");
    let two = [("key-1", "value-1"), ("key-2", "value-2")];
    assert_eq!(stats_key(&config(true, true), "nested", &two), "nested.key-1_value-1.key-2_value-2");
    assert_eq!(stats_key(&config(false, false), "nested", &two), "nested.key-1.key-2");
}

#[test]
fn value_to_metric_names_each_levels_value_where_asked() {
    let c = inline(
        "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
",
    );
    let three = |r, m, s| stats_key(&c, "domain", &[("route", r), ("http_method", m), ("subject_id", s)]);
    assert_eq!(three("draw", "GET", "123"), "domain.route_draw.http_method_GET.subject_id");
    assert_eq!(three("", "GET", "123"), "domain.route.http_method_GET.subject_id");
    assert_eq!(three("draw", "", "123"), "domain.route_draw.http_method.subject_id");
    assert_eq!(three("", "", "123"), "domain.route.http_method.subject_id");
    let c = inline(
        "domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: minute, requests_per_unit: 1}
",
    );
    assert_eq!(stats_key(&c, "d", &[("k1", "A"), ("k2", "foo")]), "d.k1_A.k2");
    let c = inline(
        "domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: minute, requests_per_unit: 1}
",
    );
    assert_eq!(stats_key(&c, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]), "d.k1.k2_Y.k3");
    // A detailed leaf overrides value_to_metric.
    let c = inline(
        "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
",
    );
    assert_eq!(
        stats_key(&c, "domain", &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")]),
        "domain.route_draw.http_method_GET.subject_id_123"
    );
    // Configured values are their own name; a wildcard with value_to_metric names the value.
    let c = inline(
        "domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 5}
",
    );
    assert_eq!(
        stats_key(&c, "domain", &[("user", "alice"), ("action", "readfile"), ("resource", "x")]),
        "domain.user_alice.action_readfile.resource"
    );
}

#[test]
fn the_wildcard_flag_matrix_names_statistics_as_upstream() {
    let wild = |flags: &str| {
        inline(&format!(
            "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*\n{flags}    rate_limit: {{unit: minute, requests_per_unit: 20}}\n"
        ))
    };
    let k = |c: &Config| stats_key(c, "test-domain", &[("wild", "foo1")]);
    assert_eq!(k(&wild("")), "test-domain.wild_foo*");
    assert_eq!(k(&wild("    value_to_metric: true\n")), "test-domain.wild_foo1");
    assert_eq!(k(&wild("    share_threshold: true\n")), "test-domain.wild_foo*");
    assert_eq!(k(&wild("    share_threshold: true\n    value_to_metric: true\n")), "test-domain.wild_foo*");
    let c = inline(
        "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
",
    );
    assert_eq!(
        stats_key(&c, "test-domain", &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]),
        "test-domain.wild_foo*.other_bar.limit"
    );
    let two = |flags: &str| {
        inline(&format!(
            "domain: test-domain\ndescriptors:\n  - key: wild\n    value: foo*bar*\n{flags}    rate_limit: {{unit: minute, requests_per_unit: 20}}\n"
        ))
    };
    assert_eq!(stats_key(&two(""), "test-domain", &[("wild", "foo123bar456")]), "test-domain.wild_foo*bar*");
    assert_eq!(
        stats_key(&two("    value_to_metric: true\n"), "test-domain", &[("wild", "foo123bar456")]),
        "test-domain.wild_foo123bar456"
    );
}

#[test]
fn values_are_read_as_go_yaml_reads_them() {
    // Numbers and booleans are strings where a string is expected; YAML 1.1 booleans count.
    let c = inline(
        "domain: d
descriptors:
  - key: port
    value: 8080
    shadow_mode: yes
    rate_limit: {unit: Second, requests_per_unit: 0x10}
  - key: ban
    rate_limit: {unit: day}
",
    );
    let d = c.domain("d").unwrap();
    let f = d.find(&[("port", "8080")]).unwrap();
    assert!(f.descriptor.shadow_mode);
    assert_eq!(f.descriptor.rate_limit.as_ref().unwrap().requests_per_unit, 16);
    assert_eq!(d.find(&[("ban", "x")]).unwrap().descriptor.rate_limit.as_ref().unwrap().requests_per_unit, 0);
    let refuse = |yaml: &str| Config::from_files([("f.yaml", yaml)], LoadOptions::default()).unwrap_err();
    let e = refuse("domain: d\ndescriptors:\n  - key: a\n    value: 1.5\n");
    assert_eq!((e.upstream().as_str(), e.line), ("f.yaml: error checking config", Some(4)));
    let e = refuse(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
    );
    assert_eq!(
        e.upstream(),
        "f.yaml: error loading config file: yaml: unmarshal errors:\n  line 4: cannot unmarshal !!int `-1` into uint32"
    );
    let e = refuse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n");
    assert!(e.message.contains("cannot unmarshal !!int `4294967296` into uint32"), "{e}");
    let e = refuse("domain: d\ndescriptors:\n  - key: a\n    shadow_mode: \"true\"\n");
    assert!(e.message.contains("cannot unmarshal !!str `true` into bool"), "{e}");
    let e = refuse(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    assert_eq!((e.upstream().as_str(), e.line), ("f.yaml: invalid rate limit unit 'fortnight'", Some(4)));
    let e = refuse("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n");
    assert_eq!(e.upstream(), "f.yaml: invalid rate limit unit ''");
    let e = refuse("domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n    rate_limit: {unit: second}\n");
    assert_eq!(
        (e.upstream().as_str(), e.line),
        ("f.yaml: share_threshold can only be used with wildcard values (containing '*'), but found key 'a_b'", Some(5))
    );
    let e = refuse("- domain: d\n");
    assert!(e.upstream().starts_with("f.yaml: error loading config file: "), "{e}");
    let e = refuse("domain: d\ndomain: e\n");
    assert!(e.message.contains("already set"), "{e}");
    // An unlimited rule with a unit that is not one is accepted, as upstream accepts it.
    inline("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: foo}\n");
    // Keys upstream knows are accepted anywhere (and ignored where they mean nothing).
    inline("domain: d\ndescriptors:\n  - key: a\n    unit: second\n    rate_limit: {unit: second, shadow_mode: true}\n");
    // Metadata holds anything.
    inline("domain: d\ndescriptors:\n  - key: a\n    metadata: {anything: [1, 2.5, {x: y}]}\n");
}

#[test]
fn a_directory_is_read_whole_with_upstreams_file_names() {
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(dir.join("config/basic.yaml"), std::fs::read(corpus("basic_config.yaml")).unwrap())
        .unwrap();
    std::fs::write(dir.join("config/another.yaml"), "domain: another\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n").unwrap();
    let c = Config::from_dir(&dir, LoadOptions::default()).unwrap();
    assert_eq!(c.domains().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["another", "test-domain"]);
    assert_eq!(c.domain("test-domain").unwrap().file, "config.basic.yaml");
    std::fs::write(dir.join("config/.hidden.yaml"), "domain: another\n").unwrap();
    let e = Config::from_dir(&dir, LoadOptions::default()).unwrap_err();
    assert_eq!(e.upstream(), "config.another.yaml: duplicate domain 'another' in config file");
    Config::from_dir(&dir, LoadOptions { ignore_dotfiles: true, ..LoadOptions::default() }).unwrap();
    std::fs::write(
        dir.join("config/bad.yaml"),
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: week}\n  - key: k\n",
    )
    .unwrap();
    let e =
        Config::from_dir(&dir, LoadOptions { ignore_dotfiles: true, ..LoadOptions::default() }).unwrap_err();
    assert_eq!(e.to_string(), "config.bad.yaml:5: duplicate descriptor composite key 'x.k'");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Kubernetes ConfigMap's mount: each file is a link to `..data/<file>`, `..data` a link to
/// a timestamped directory. Upstream reads it with RUNTIME_IGNOREDOTFILES; without, each
/// domain is read twice.
#[test]
fn a_configmap_mount_is_read_once_when_dotfiles_are_ignored() {
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-configmap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let stamped = dir.join("..2026_12_07_00_00_00.000000001");
    std::fs::create_dir_all(&stamped).unwrap();
    std::fs::write(
        stamped.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("..2026_12_07_00_00_00.000000001", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/edge.yaml", dir.join("edge.yaml")).unwrap();
    let c = Config::from_dir(&dir, LoadOptions { ignore_dotfiles: true, ..LoadOptions::default() }).unwrap();
    assert_eq!(
        c.domains().map(|d| (d.name.as_str(), d.file.as_str())).collect::<Vec<_>>(),
        [("edge", "edge.yaml")]
    );
    let e = Config::from_dir(&dir, LoadOptions::default()).unwrap_err();
    assert!(e.upstream().ends_with("duplicate domain 'edge' in config file"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

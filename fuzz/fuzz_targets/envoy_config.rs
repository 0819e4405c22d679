//! envoyproxy/ratelimit's YAML configuration, as tollgate-envoy reads it, from any text (bytes
//! that are not UTF-8 are read lossily). Checks: nothing panics, however deep or odd the
//! document; a refusal names the file and has a message, and its line (when it has one) is a
//! line of the input; a configuration that loads answers lookups made from the input's own
//! words (keys and values cut from it), and every rule it finds has a statistics key under its
//! domain; its rules' tables are made (each algorithm's quota checked) or refused with a
//! message, and a request made from the input's words is decided without a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_envoy::{Config, Limits, LoadOptions, Request, RequestDescriptor};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Config::from_files([("fuzz.yaml", text.as_ref())], LoadOptions::default()) {
        Err(e) => {
            assert_eq!(e.file, "fuzz.yaml");
            assert!(!e.message.is_empty(), "{e:?} has no message");
            if let Some(line) = e.line {
                // YAML breaks lines at \n, \r and \r\n: at most one line per break, plus one.
                let breaks = text.matches(['\n', '\r']).count();
                assert!(line >= 1 && line <= breaks + 1, "line {line} of {e}");
            }
            assert!(e.upstream().starts_with("fuzz.yaml: "));
        }
        Ok(config) => {
            let words: Vec<&str> = text.split(|c: char| c.is_whitespace() || ":{},[]-".contains(c)).collect();
            for domain in config.domains() {
                for window in words.windows(2).take(64) {
                    for depth in 1..=3 {
                        let entries: Vec<(&str, &str)> =
                            (0..depth).map(|i| (window[i % 2], window[(i + 1) % 2])).collect();
                        if let Some(found) = domain.find(&entries) {
                            assert!(found.descriptor.rate_limit.is_some());
                            assert!(found.stats_key.starts_with(&domain.name), "{}", found.stats_key);
                            assert_eq!(found.levels.len(), entries.len());
                        }
                    }
                }
            }
            let names: Vec<String> = config.domains().map(|d| d.name.clone()).collect();
            match Limits::new(config, 4) {
                Err(e) => assert!(!e.message.is_empty() && e.file == "fuzz.yaml", "{e:?}"),
                Ok(limits) => {
                    for (domain, window) in names.iter().zip(words.windows(2)) {
                        let request = Request {
                            domain: domain.clone(),
                            descriptors: vec![RequestDescriptor {
                                entries: vec![(window[0].to_owned(), window[1].to_owned())],
                                ..RequestDescriptor::default()
                            }],
                            hits_addend: 1,
                        };
                        if !domain.is_empty() {
                            assert_eq!(limits.should_rate_limit(&request).map(|r| r.statuses.len()), Ok(1));
                        }
                    }
                }
            }
        }
    }
});

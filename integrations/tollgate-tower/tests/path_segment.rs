//! `PathSegment` and `PathParam`, a route parameter as the key: its place among the path's
//! non-empty segments, percent-decoded, so that no re-encoding of a value is another client
//! (and, parsed, no other spelling of a number); missing, undecodable and unparsable segments
//! are typed errors; no path panics.

use http::request::Parts;
use http::Request;
use proptest::prelude::*;
use tollgate_tower::{KeyError, KeyExtractor, PathParam, PathSegment};

fn parts(uri: &str) -> Parts {
    Request::get(uri).body(()).unwrap().into_parts().0
}

fn key(i: usize, uri: &str) -> Result<String, KeyError> {
    PathSegment(i).extract(&parts(uri))
}

#[test]
fn a_segment_by_its_place() {
    assert_eq!(key(0, "/users/42/posts"), Ok("users".into()));
    assert_eq!(key(1, "/users/42/posts"), Ok("42".into()));
    assert_eq!(key(2, "/users/42/posts?x=1"), Ok("posts".into()));
    assert_eq!(key(1, "/users/42/"), Ok("42".into()));
    assert_eq!(key(1, "/users/42?id=7"), Ok("42".into()), "the query is not the path");
    assert_eq!(key(1, "http://example.com/users/42"), Ok("42".into()), "absolute form");
    // Empty segments are not counted, as a server that collapses slashes routes these.
    assert_eq!(key(1, "//users/42"), Ok("42".into()));
    assert_eq!(key(1, "/users//42"), Ok("42".into()));
    // Dot segments are not resolved: the key is what the router is given (docs).
    assert_eq!(key(1, "/users/./42"), Ok(".".into()));
}

#[test]
fn encodings_of_one_value_are_one_key() {
    for uri in ["/users/42", "/users/%34%32", "/users/%342", "/users/4%32"] {
        assert_eq!(key(1, uri), Ok("42".into()), "{uri}");
    }
    assert_eq!(key(1, "/users/caf%C3%A9"), Ok("café".into()));
    assert_eq!(key(1, "/users/a%2Fb/x"), Ok("a/b".into()), "an encoded slash stays in its segment");
    // Not an escape: kept as written (a router that decodes rejects it before any handler).
    assert_eq!(key(1, "/users/%zz"), Ok("%zz".into()));
    // Decoded once, as a router decodes: `%2541` is the text `%41`, not `A`.
    assert_eq!(key(1, "/users/%2541"), Ok("%41".into()));
    // As text, other spellings of a number are other keys: `PathParam` parses them.
    assert_ne!(key(1, "/users/042"), key(1, "/users/42"));
}

#[test]
fn a_parsed_parameter_is_one_key_however_it_is_spelled() {
    let id = |uri: &str| PathParam::<u64>::new(1).extract(&parts(uri));
    for uri in ["/users/42", "/users/042", "/users/+42", "/users/%34%32", "//users/0042/posts"] {
        assert_eq!(id(uri), Ok(42), "{uri}");
    }
    assert_eq!(id("/users/x42"), Err(KeyError::MalformedPathSegment(1)));
    assert_eq!(id("/users/-1"), Err(KeyError::MalformedPathSegment(1)));
    assert_eq!(id("/users/18446744073709551616"), Err(KeyError::MalformedPathSegment(1)), "above u64");
    assert_eq!(id("/users"), Err(KeyError::MissingPathSegment(1)));
    let ip = PathParam::<std::net::IpAddr>::new(1).extract(&parts("/hosts/10.0.0.1"));
    assert_eq!(ip, Ok("10.0.0.1".parse().unwrap()));
}

#[test]
fn missing_empty_and_undecodable_segments_are_errors() {
    assert_eq!(key(1, "/users"), Err(KeyError::MissingPathSegment(1)));
    assert_eq!(key(1, "/users/"), Err(KeyError::MissingPathSegment(1)));
    assert_eq!(key(2, "/users//"), Err(KeyError::MissingPathSegment(2)));
    assert_eq!(key(0, "/"), Err(KeyError::MissingPathSegment(0)));
    assert_eq!(key(0, "//"), Err(KeyError::MissingPathSegment(0)));
    assert_eq!(key(1, "/users/%FF"), Err(KeyError::MalformedPathSegment(1)));
    assert_eq!(key(1, "/users/%C3"), Err(KeyError::MalformedPathSegment(1)));
    let message = KeyError::MalformedPathSegment(1).to_string();
    assert!(message.contains("segment 1") && message.contains("UTF-8"), "{message}");
    assert!(KeyError::MissingPathSegment(3).to_string().contains("no segment 3"));
}

proptest! {
    /// Any value, written plainly (where it can be) or with any of its bytes percent-encoded, is
    /// the same key; a segment's neighbours never leak into it.
    #[test]
    fn any_encoding_is_the_same_key(value in "[a-zA-Z0-9._~é%-]{1,12}", mask in any::<u64>(), before in 0usize..3) {
        let mut segment = String::new();
        for (i, b) in value.bytes().enumerate() {
            // `%` itself is always encoded: written plainly it would start an escape.
            if mask >> (i % 64) & 1 == 1 || !b.is_ascii() || b == b'%' {
                segment.push_str(&format!("%{b:02X}"));
            } else {
                segment.push(char::from(b));
            }
        }
        let uri = format!("/{}{segment}/tail", "x/".repeat(before));
        prop_assert_eq!(key(before, &uri), Ok(value));
    }

    /// No path panics; every answer is a key or a typed error.
    #[test]
    fn no_path_panics(path in "/[ -~]{0,40}", i in 0usize..6) {
        if let Ok(uri) = path.parse::<http::Uri>() {
            let mut p = parts("/");
            p.uri = uri;
            match PathSegment(i).extract(&p) {
                Ok(k) => prop_assert!(!k.is_empty()),
                Err(KeyError::MissingPathSegment(j) | KeyError::MalformedPathSegment(j)) => prop_assert_eq!(j, i),
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }
}

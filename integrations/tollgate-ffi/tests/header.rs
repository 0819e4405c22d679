//! The committed header declares every function the library exports (a function added
//! without regenerating `include/tollgate.h` fails here; cbindgen's output itself is checked
//! by compiling the C test against it).

#[test]
fn the_header_declares_every_exported_function() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(dir.join("include/tollgate.h")).unwrap();
    let mut exported = Vec::new();
    for file in ["src/lib.rs", "src/handles.rs", "src/meters.rs"] {
        let src = std::fs::read_to_string(dir.join(file)).unwrap();
        for line in src.lines() {
            if let Some(rest) = line.split("extern \"C\" fn ").nth(1) {
                exported.push(rest.split('(').next().unwrap().to_owned());
            }
        }
    }
    assert!(exported.len() >= 25, "{exported:?}");
    for f in &exported {
        assert!(header.contains(&format!("{f}(")), "include/tollgate.h does not declare {f}: run cbindgen");
    }
    // Every function the header declares (a line that opens an argument list after a name).
    let declared: Vec<&str> = header
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") && !l.trim_start().starts_with('*'))
        .filter_map(|l| l.split('(').next().filter(|head| head.len() < l.len()))
        .filter_map(|head| head.split_whitespace().last())
        .map(|name| name.trim_start_matches('*'))
        .filter(|name| name.starts_with("tollgate_"))
        .collect();
    assert_eq!(declared.len(), exported.len(), "{declared:?}");
    for name in declared {
        assert!(exported.iter().any(|f| f == name), "include/tollgate.h declares {name}, which is gone");
    }
}

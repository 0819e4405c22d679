//! The committed header declares every function the library exports (a function added
//! without regenerating `include/tollgate.h` fails here; cbindgen's output itself is checked
//! by compiling the C test against it).

#[test]
fn the_header_declares_every_exported_function() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(dir.join("include/tollgate.h")).unwrap();
    let mut exported = Vec::new();
    for file in ["src/lib.rs", "src/handles.rs"] {
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
    for line in header.lines().filter(|l| l.contains("tollgate_") && l.trim_end().ends_with('(')) {
        let name = line.split_whitespace().last().unwrap().trim_start_matches('*').trim_end_matches('(');
        assert!(exported.iter().any(|f| f == name), "include/tollgate.h declares {name}, which is gone");
    }
}

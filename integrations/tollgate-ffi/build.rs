//! Gives the shared library an SONAME, so that programs linked against it record which ABI
//! they need (`libtollgate_ffi.so.0.1` for every 0.1.x release: before 1.0, a minor release
//! may break the ABI; from 1.0 on, the major version alone), and `install.sh` can install the
//! usual chain of links to it.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" || os == "android" || os.ends_with("bsd") {
        let major = env!("CARGO_PKG_VERSION_MAJOR");
        let abi =
            if major == "0" { format!("0.{}", env!("CARGO_PKG_VERSION_MINOR")) } else { major.to_owned() };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtollgate_ffi.so.{abi}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

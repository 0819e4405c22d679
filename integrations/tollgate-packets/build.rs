//! With the `dpdk` feature: compiles `dpdk/shim.c` (DPDK's meters are inline functions of
//! `rte_meter.h`, which Rust cannot call) with libdpdk's flags from pkg-config, and links DPDK.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "dpdk")]
    {
        println!("cargo:rerun-if-changed=dpdk/shim.c");
        let dpdk = pkg_config::Config::new().probe("libdpdk").unwrap_or_else(|e| {
            panic!("the dpdk feature needs DPDK's headers and libraries (apt-get install libdpdk-dev): {e}")
        });
        let mut build = cc::Build::new();
        build.file("dpdk/shim.c").flag_if_supported("-march=native");
        for path in &dpdk.include_paths {
            build.include(path);
        }
        for (name, value) in &dpdk.defines {
            build.define(name, value.as_deref());
        }
        build.compile("tollgate_dpdk_shim");
    }
}

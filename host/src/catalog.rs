//! Every kernel handle of the library, by family, and the check that ties the handles to the
//! embedded PTX: each entry of each target's module has exactly one handle, and each handle's
//! parameter size and launch bounds are what the PTX declares. (Each launch is checked again
//! when it runs.)

use crate::ptx::Arch;
use kernel_abi::KernelDecl;

/// The kernel tables of the families (`kernel_abi::<family>::KERNELS`).
pub const FAMILIES: &[(&str, &[KernelDecl])] = &[
    ("attention", kernel_abi::attention::KERNELS),
    (
        "attention negative controls",
        kernel_abi::attention::backward::NEGATIVE,
    ),
    ("gemm", kernel_abi::gemm::KERNELS),
    ("gla", kernel_abi::gla::KERNELS),
    ("gla negative controls", kernel_abi::gla::backward::NEGATIVE),
    ("mhc", kernel_abi::mhc::KERNELS),
    ("semicrf", kernel_abi::semicrf::KERNELS),
    ("semicrf negative controls", kernel_abi::semicrf::NEGATIVE),
    ("smoke", kernel_abi::smoke::KERNELS),
];

/// Every handle.
pub fn all() -> impl Iterator<Item = &'static KernelDecl> {
    FAMILIES.iter().flat_map(|(_, table)| table.iter())
}

/// The handle named `name`, if any.
pub fn find(name: &str) -> Option<&'static KernelDecl> {
    all().find(|k| k.name == name)
}

/// Disagreements between the handles and `arch`'s PTX: entries without a handle, handles
/// declared twice, and handles whose parameter size or launch bounds differ from the entry's.
/// Handles of kernels that `arch` does not build (the Hopper-only ones on `sm_80`) are not
/// reported; [`missing_everywhere`] finds handles no target builds.
pub fn mismatches(arch: Arch) -> Vec<String> {
    let mut problems = Vec::new();
    let ptx = arch.kernels();
    for name in ptx.keys() {
        match all().filter(|k| k.name == name).count() {
            1 => {}
            0 => problems.push(format!("{arch} entry {name} has no handle")),
            n => problems.push(format!("{name} has {n} handles")),
        }
    }
    for k in all() {
        let Some(info) = ptx.get(k.name) else {
            continue;
        };
        if info.params != [k.param_bytes] {
            problems.push(format!(
                "{arch} {}: the PTX declares parameters of {:?} bytes, the handle's struct has {}",
                k.name, info.params, k.param_bytes
            ));
        }
        if info.max_threads != Some(k.threads) || info.min_blocks != Some(k.min_blocks) {
            problems.push(format!(
                "{arch} {}: the PTX declares launch bounds ({:?}, {:?}), the handle ({}, {})",
                k.name, info.max_threads, info.min_blocks, k.threads, k.min_blocks
            ));
        }
    }
    problems
}

/// Handles whose kernel is in no target's PTX.
pub fn missing_everywhere() -> Vec<&'static str> {
    all()
        .filter(|k| Arch::ALL.iter().all(|a| !a.kernels().contains_key(k.name)))
        .map(|k| k.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_has_one_handle_that_agrees_with_the_ptx() {
        for arch in Arch::ALL {
            let problems = mismatches(arch);
            assert!(problems.is_empty(), "{arch}:\n{}", problems.join("\n"));
        }
        assert_eq!(missing_everywhere(), Vec::<&str>::new());
        println!(
            "{} handles, {} sm_90a entries, {} sm_80 entries",
            all().count(),
            Arch::Sm90a.kernels().len(),
            Arch::Sm80.kernels().len()
        );
    }
}

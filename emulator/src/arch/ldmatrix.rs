//! Emulated `ldmatrix.sync.aligned.m8n8.{x4,x2}[.trans].shared.b16` (see the device module for
//! the fragment layout): lanes publish their row addresses, each lane gathers its registers.
//! Each lane's row (16 bytes) counts as a load of its warp for the hazard detector
//! (`crate::emu::track_smem`), as racecheck sees `ldmatrix`.

use crate::emu::{ctx, smem_ptr, track_smem, warp_exchange};

fn row(addr: u32) -> u32 {
    // Every row address is 16 bytes of shared memory, 16-byte aligned.
    smem_ptr(addr, 16, 16);
    addr
}

fn read_u16(addr: u32) -> u32 {
    // SAFETY: in bounds and aligned (checked by `smem_ptr`).
    unsafe { (smem_ptr(addr, 2, 2) as *const u16).read() as u32 }
}

fn read_u32(addr: u32) -> u32 {
    // SAFETY: in bounds and aligned (checked by `smem_ptr`).
    unsafe { (smem_ptr(addr, 4, 4) as *const u32).read() }
}

fn load<const R: usize>(addr: u32, trans: bool) -> [u32; R] {
    let l = ctx().tid % 32;
    // Lanes 0..8 R give the rows (the others' addresses are ignored, as on the device).
    if (l as usize) < 8 * R {
        track_smem(row(addr), 16, false);
    }
    warp_exchange(&[addr], |get| {
        core::array::from_fn(|j| {
            let j = j as u32;
            if trans {
                // Elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of matrix j.
                let r0 = row(get(8 * j + 2 * (l % 4), 0));
                let r1 = row(get(8 * j + 2 * (l % 4) + 1, 0));
                read_u16(r0 + 2 * (l / 4)) | read_u16(r1 + 2 * (l / 4)) << 16
            } else {
                // Elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of matrix j.
                read_u32(row(get(8 * j + l / 4, 0)) + 4 * (l % 4))
            }
        })
    })
}

/// `.x4`.
///
/// # Safety
/// As on the device.
pub unsafe fn x4(addr: u32) -> [u32; 4] {
    load::<4>(addr, false)
}

/// `.x4.trans`.
///
/// # Safety
/// As on the device.
pub unsafe fn x4_trans(addr: u32) -> [u32; 4] {
    load::<4>(addr, true)
}

/// `.x2`.
///
/// # Safety
/// As on the device.
pub unsafe fn x2(addr: u32) -> [u32; 2] {
    load::<2>(addr, false)
}

/// `.x2.trans`.
///
/// # Safety
/// As on the device.
pub unsafe fn x2_trans(addr: u32) -> [u32; 2] {
    load::<2>(addr, true)
}

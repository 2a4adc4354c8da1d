//! Resource figures read out of a cubin itself: its `.nv.info` section holds, per kernel, the
//! register count (attribute EIATTR_REGCOUNT, 0x2f) and the stack frame (EIATTR_FRAME_SIZE, 0x11).
//! NVRTC's ptxas report is the richer source (it splits spill stores and loads), but it is missing
//! when NVRTC serves a compile from a cache of its own, as the toolkit's NVRTC on the GPU machine
//! does: the cubin always has these.

/// Registers and stack frame bytes of the (single) kernel in `image`, if it is a 64-bit ELF with
/// an `.nv.info` section that gives them.
pub fn registers_and_frame(image: &[u8]) -> Option<(u32, u32)> {
    let u16_at = |o: usize| image.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| image.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let u64_at = |o: usize| image.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    if image.get(..4)? != b"\x7fELF" || *image.get(4)? != 2 {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let (shentsize, shnum, shstrndx) =
        (usize::from(u16_at(0x3a)?), usize::from(u16_at(0x3c)?), usize::from(u16_at(0x3e)?));
    // Section header: name (u32), type (u32), flags (u64), addr (u64), offset (u64), size (u64), ...
    let header = |i: usize| -> Option<(u32, usize, usize)> {
        let h = shoff + i * shentsize;
        Some((u32_at(h)?, usize::try_from(u64_at(h + 0x18)?).ok()?, usize::try_from(u64_at(h + 0x20)?).ok()?))
    };
    let (_, names_off, _) = header(shstrndx)?;
    for i in 0..shnum {
        let (name, off, size) = header(i)?;
        let name_start = names_off + name as usize;
        let name_bytes = image.get(name_start..)?;
        let name = &name_bytes[..name_bytes.iter().position(|&b| b == 0)?];
        if name != b".nv.info" {
            continue;
        }
        let body = image.get(off..off + size)?;
        let (mut regs, mut frame) = (None, None);
        let mut p = 0;
        while p + 4 <= body.len() {
            let (format, attr) = (body[p], body[p + 1]);
            let len = usize::from(u16::from_le_bytes([body[p + 2], body[p + 3]]));
            // Format 4 carries `len` bytes of value; the others carry their value in the length field.
            if format != 4 {
                p += 4;
                continue;
            }
            let value = body.get(p + 4..p + 4 + len)?;
            if len == 8 {
                let v = u32::from_le_bytes([value[4], value[5], value[6], value[7]]);
                match attr {
                    0x2f => regs = Some(v),
                    0x11 => frame = Some(v),
                    _ => {}
                }
            }
            p += 4 + len;
        }
        return Some((regs?, frame.unwrap_or(0)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with a section-name table and an `.nv.info` section holding
    /// REGCOUNT = 40 and FRAME_SIZE = 16 for symbol 8.
    fn tiny_cubin() -> Vec<u8> {
        let names = b"\0.shstrtab\0.nv.info\0".to_vec();
        let mut info = Vec::new();
        for (attr, v) in [(0x2fu8, 40u32), (0x11, 16)] {
            info.extend_from_slice(&[4, attr, 8, 0]);
            info.extend_from_slice(&8u32.to_le_bytes());
            info.extend_from_slice(&v.to_le_bytes());
        }
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        let names_off = elf.len();
        elf.extend_from_slice(&names);
        let info_off = elf.len();
        elf.extend_from_slice(&info);
        let shoff = elf.len();
        let header = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            h
        };
        elf.extend(header(0, 0, 0));
        elf.extend(header(1, names_off, names.len()));
        elf.extend(header(11, info_off, info.len()));
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf
    }

    #[test]
    fn reads_the_attributes() {
        assert_eq!(registers_and_frame(&tiny_cubin()), Some((40, 16)));
        assert_eq!(registers_and_frame(b"not an elf"), None);
        let mut truncated = tiny_cubin();
        truncated.truncate(100);
        assert_eq!(registers_and_frame(&truncated), None);
    }
}

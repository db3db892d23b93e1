//! What a CUBIN holds, read from its ELF image without CUDA's tools: its sections, and the
//! size of each function's machine code.
//!
//! The executor's time depends on its code size as well as on its spills: the interpreter
//! stalls on instruction fetch after its far jumps (round 117, results/INDEX.md), and taking
//! ~1 000 instructions out of it made every staged call faster (round 120). ptxas's report
//! ([`crate::nvrtc::FunctionResources`]) gives registers and spills but not size; the ELF
//! gives size: each function's code is a section `.text.<symbol>`, and from sm_70 on every
//! instruction is 128 bits.

use thiserror::Error;

/// Bytes per machine instruction on every architecture the runtime compiles for (sm_70 and
/// later encode each instruction, control bits included, in 128 bits).
pub const INSTRUCTION_BYTES: u64 = 16;

/// One function's machine code in a CUBIN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCode {
    /// The function's symbol (an `extern "C"` name or a mangled C++ name).
    pub function: String,
    /// Bytes of machine code (the size of its `.text.` section).
    pub bytes: u64,
}

impl FunctionCode {
    /// Machine instructions, [`INSTRUCTION_BYTES`] each.
    pub fn instructions(&self) -> u64 {
        self.bytes / INSTRUCTION_BYTES
    }
}

/// One section of a CUBIN's ELF image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Its name (`.text.<symbol>`, `.nv.constant0.<symbol>`, `.nv.info`, ...).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Why a CUBIN's ELF image could not be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CubinError {
    /// The image does not start with a 64-bit little-endian ELF header.
    #[error("not a 64-bit little-endian ELF image")]
    NotElf64,
    /// A header, section or name lies outside the image, or a size is inconsistent.
    #[error("malformed ELF image: {0}")]
    Malformed(&'static str),
}

const SECTION_PREFIX: &str = ".text.";
const ELF_HEADER_BYTES: usize = 64;
const SECTION_HEADER_BYTES: usize = 64;

/// Every section of a CUBIN (`nvrtcGetCUBIN`'s output), in section-header order.
pub fn sections(cubin: &[u8]) -> Result<Vec<Section>, CubinError> {
    if cubin.len() < ELF_HEADER_BYTES || cubin[..4] != *b"\x7fELF" || cubin[4] != 2 || cubin[5] != 1 {
        return Err(CubinError::NotElf64);
    }
    let section_table = to_usize(u64_at(cubin, 0x28)?)?;
    let entry_size = usize::from(u16_at(cubin, 0x3a)?);
    let count = usize::from(u16_at(cubin, 0x3c)?);
    let names_index = usize::from(u16_at(cubin, 0x3e)?);
    if entry_size < SECTION_HEADER_BYTES || names_index >= count {
        return Err(CubinError::Malformed("section header table"));
    }
    let header = |i: usize| -> Result<usize, CubinError> {
        let at = i
            .checked_mul(entry_size)
            .and_then(|o| o.checked_add(section_table))
            .ok_or(CubinError::Malformed("section header offset"))?;
        match at.checked_add(SECTION_HEADER_BYTES) {
            Some(end) if end <= cubin.len() => Ok(at),
            _ => Err(CubinError::Malformed("section header past the end")),
        }
    };
    let names = header(names_index)?;
    let names_start = to_usize(u64_at(cubin, names + 24)?)?;
    let names_len = to_usize(u64_at(cubin, names + 32)?)?;
    let name_table = names_start
        .checked_add(names_len)
        .and_then(|end| cubin.get(names_start..end))
        .ok_or(CubinError::Malformed("section name table past the end"))?;
    (0..count)
        .map(|i| {
            let h = header(i)?;
            let name_at = to_usize(u64::from(u32_at(cubin, h)?))?;
            let name = name_table.get(name_at..).ok_or(CubinError::Malformed("section name offset"))?;
            let name = &name[..name.iter().position(|&b| b == 0).ok_or(CubinError::Malformed("unterminated name"))?];
            Ok(Section { name: String::from_utf8_lossy(name).into_owned(), bytes: u64_at(cubin, h + 32)? })
        })
        .collect()
}

/// Each function's code size, in section order, from a CUBIN (`nvrtcGetCUBIN`'s output).
pub fn function_code(cubin: &[u8]) -> Result<Vec<FunctionCode>, CubinError> {
    Ok(sections(cubin)?
        .into_iter()
        .filter_map(|s| {
            let function = s.name.strip_prefix(SECTION_PREFIX)?.to_string();
            Some(FunctionCode { function, bytes: s.bytes })
        })
        .collect())
}

fn to_usize(v: u64) -> Result<usize, CubinError> {
    usize::try_from(v).map_err(|_| CubinError::Malformed("offset beyond the address space"))
}

fn bytes_at<const N: usize>(image: &[u8], at: usize) -> Result<[u8; N], CubinError> {
    at.checked_add(N)
        .and_then(|end| image.get(at..end))
        .and_then(|b| b.try_into().ok())
        .ok_or(CubinError::Malformed("field past the end"))
}

fn u16_at(image: &[u8], at: usize) -> Result<u16, CubinError> {
    bytes_at(image, at).map(u16::from_le_bytes)
}

fn u32_at(image: &[u8], at: usize) -> Result<u32, CubinError> {
    bytes_at(image, at).map(u32::from_le_bytes)
}

fn u64_at(image: &[u8], at: usize) -> Result<u64, CubinError> {
    bytes_at(image, at).map(u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 image written field by field from the format's definition: a null section,
    /// the given sections (name, size) and the name table last.
    fn elf(sections: &[(&str, u64)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_at = Vec::new();
        for (name, _) in sections {
            name_at.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let shstrtab_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let names_at = ELF_HEADER_BYTES as u64;
        let table_at = names_at + names.len() as u64;
        let count = sections.len() + 2;
        let mut image = vec![0u8; ELF_HEADER_BYTES];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2; // ELFCLASS64
        image[5] = 1; // little-endian
        image[0x28..0x30].copy_from_slice(&table_at.to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&(SECTION_HEADER_BYTES as u16).to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&(count as u16).to_le_bytes());
        image[0x3e..0x40].copy_from_slice(&((count - 1) as u16).to_le_bytes());
        image.extend_from_slice(&names);
        let mut header = |name: u32, offset: u64, size: u64| {
            let mut h = [0u8; SECTION_HEADER_BYTES];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            image.extend_from_slice(&h);
        };
        header(0, 0, 0);
        for ((_, size), name) in sections.iter().zip(&name_at) {
            header(*name, 0, *size);
        }
        header(shstrtab_name, names_at, names.len() as u64);
        image
    }

    #[test]
    fn text_sections_are_functions_and_nothing_else_is() {
        let image = elf(&[(".text.entry", 160), (".nv.info", 48), (".text._Z3fooi", 32), (".text", 16)]);
        let code = function_code(&image).expect("readable");
        assert_eq!(
            code,
            [
                FunctionCode { function: "entry".into(), bytes: 160 },
                FunctionCode { function: "_Z3fooi".into(), bytes: 32 },
            ]
        );
        assert_eq!(code[0].instructions(), 10);
        let names: Vec<_> = sections(&image).expect("readable").into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["", ".text.entry", ".nv.info", ".text._Z3fooi", ".text", ".shstrtab"]);
    }

    #[test]
    fn a_damaged_image_is_an_error_not_a_panic() {
        assert_eq!(function_code(b"not an elf"), Err(CubinError::NotElf64));
        let image = elf(&[(".text.entry", 160)]);
        for cut in [ELF_HEADER_BYTES, image.len() - 1] {
            assert!(matches!(function_code(&image[..cut]), Err(CubinError::Malformed(_))), "cut at {cut}");
        }
        let mut wild = image.clone();
        wild[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(function_code(&wild), Err(CubinError::Malformed(_))));
        let mut no_names = image;
        no_names[0x3e..0x40].copy_from_slice(&99u16.to_le_bytes());
        assert!(matches!(function_code(&no_names), Err(CubinError::Malformed(_))));
    }
}

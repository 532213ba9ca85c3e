"""Normalisation, the first stage: cleaning, whitespace to " ", accent stripping and lowercasing (uncased), each
normalised character keeping the position of the original character it came from.

Character classes are those of the Rust tokenizer behind BertTokenizerFast (the test oracle), which differ from
google-research's tokenization.py in places. Its category tables are Unicode 8.0, so a character assigned later is,
to it, unassigned: kept, never punctuation, never a stripped mark (_ASSIGNED_IN_UNICODE_8, _CATEGORY_IN_UNICODE_8);
its lowercasing uses newer tables (_NEW_LOWERCASE). The predicates here (WHITESPACE, is_punct, is_cjk) also decide
where pretokenize splits, which is how CJK ideographs become words of their own.
"""

from __future__ import annotations

import bisect
import functools
import unicodedata

import numpy as np

# Unicode White_Space (Rust's char::is_whitespace); google-research uses Zs only, so keeps U+2028 / U+2029 as chars
WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                        "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# CJK Unified Ideographs blocks (not Hangul or kana); Extension E from 0x2B920 as in Rust (google-research: 0x2B820)
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def hex_ranges(table: str) -> list[tuple[int, int]]:
    """(first, last) code points of a table of hex ranges: "41-5A 61" -> [(0x41, 0x5A), (0x61, 0x61)]."""
    return [(int(a, 16), int(b or a, 16)) for a, _, b in (r.partition("-") for r in table.split())]


@functools.cache
def _unicode8_starts_ends() -> tuple[list[int], list[int]]:
    ranges = hex_ranges(_ASSIGNED_IN_UNICODE_8)
    return [a for a, _ in ranges], [b for _, b in ranges]


def _assigned_in_unicode_8(cp: int) -> bool:
    starts, ends = _unicode8_starts_ends()
    i = bisect.bisect_right(starts, cp) - 1
    return i >= 0 and cp <= ends[i]


# Categories changed since Unicode 8.0 (Rust sees the 8.0 value); source: UCD DerivedGeneralCategory history
_CATEGORY_IN_UNICODE_8 = {
    0x166D: "Po",   # CANADIAN SYLLABICS CHI SIGN: Po -> So in Unicode 12.0
    0x111C9: "Po",  # SHARADA SANDHI MARK: Po -> Mn in Unicode 11.0
    0x1734: "Mn",   # HANUNOO SIGN PAMUDPOD: Mn -> Mc in Unicode 14.0
    0x1885: "Lo",   # MONGOLIAN LETTER ALI GALI BALUDA: Lo -> Mn in Unicode 9.0
    0x1886: "Lo",   # MONGOLIAN LETTER ALI GALI THREE BALUDA: Lo -> Mn in Unicode 9.0
    0xA9BD: "Mc",   # JAVANESE CONSONANT SIGN KERET: Mc -> Mn in Unicode 12.0
}

# Lowercase pairs Python 3.11 (Unicode 14.0) lacks; Rust's std (17.0) lowercases them despite its 8.0 categories
_NEW_LOWERCASE = {0x1C89: 0x1C8A, 0xA7CB: 0x0264, 0xA7CC: 0xA7CD, 0xA7CE: 0xA7CF, 0xA7D2: 0xA7D3, 0xA7D4: 0xA7D5,
                  0xA7DA: 0xA7DB, 0xA7DC: 0x019B,
                  **{cp: cp + 0x20 for cp in range(0x10D50, 0x10D66)},   # Garay (16.0)
                  **{cp: cp + 0x1B for cp in range(0x16EA0, 0x16EB9)}}   # Beria Erfe (17.0)


def _lower_char(c: str) -> str:
    low = c.lower()
    if low == c:
        cp = _NEW_LOWERCASE.get(ord(c))
        if cp is not None:
            return chr(cp)
    return low


def _category(c: str) -> str:
    """General category as the Rust tokenizer's Unicode 8.0 tables see it (Cn for anything assigned later)."""
    cp = ord(c)
    cat = _CATEGORY_IN_UNICODE_8.get(cp)
    if cat is not None:
        return cat
    if cp < 0x80 or 0xD800 <= cp <= 0xDFFF or _assigned_in_unicode_8(cp):  # surrogates: Cs in every version
        return unicodedata.category(c)
    return "Cn"


def _is_removed(c: str) -> bool:
    """Dropped by cleaning: NUL, U+FFFD, and every Cc / Cf / Cs / Co char except tab / LF / CR (so also U+001C..U+001F,
    which google-research keeps as whitespace). Unassigned (Cn) code points are kept, as the Rust tokenizer keeps them
    (google-research's "C*" test would drop them)."""
    if c in "\t\n\r":
        return False
    return c == "\x00" or c == "\ufffd" or _category(c) in ("Cc", "Cf", "Cs", "Co")


def is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def is_punct(c: str) -> bool:
    """ASCII punctuation (every printable non-alphanumeric) or General_Category P* as Unicode 8.0 has it."""
    return c in _ASCII_PUNCT or _category(c)[0] == "P"


def _ccc(c: str) -> int:
    """Canonical combining class (0 for a char Unicode 8.0 did not have, as in the Rust tables)."""
    if c.isascii():
        return 0
    cp = ord(c)
    return unicodedata.combining(c) if (0xD800 <= cp <= 0xDFFF or _assigned_in_unicode_8(cp)) else 0


def _nfd(c: str) -> str:
    """Canonical decomposition of one char; a char unknown to Unicode 8.0 does not decompose (Rust tables)."""
    if c.isascii() or not _assigned_in_unicode_8(ord(c)):
        return c
    return unicodedata.normalize("NFD", c)


def _marks(c: str) -> str:   # "m": NFD holds a nonzero-class mark, "" removed, else "o"; "mm" may need reordering
    return "" if _is_removed(c) else "m" if any(_ccc(x) for x in _nfd(c)) else "o"


class LazyMap(dict):
    """A dict filled on demand, fn(key) memoised: a str.translate table (keyed by code point), a word index."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __missing__(self, key):
        v = self[key] = self.fn(key)
        return v


class Normalizer:
    """Cleaning + accent stripping + lowercasing of arbitrary text, with alignment to the original characters.
    Lazily-filled str.translate tables keep the per-character work in C: `norm` (char -> normalised form, "" when
    removed) and `width` (char -> chr(len(normalised form))), to build the alignment only where it is needed."""

    def __init__(self, lowercase: bool, strip_accents: bool):
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.norm = LazyMap(lambda cp: self._normalize_char(chr(cp)))
        self.width = LazyMap(lambda cp: chr(len(self.norm[cp])))
        self.marks = LazyMap(lambda cp: _marks(chr(cp)))

    def _normalize_char(self, c: str) -> str:
        if _is_removed(c):
            return ""
        if c in WHITESPACE:
            return " "
        n = c
        if self.strip_accents:
            n = "".join(x for x in _nfd(n) if _category(x) != "Mn")
        if self.lowercase:
            # after NFD (google-research lowercases first) and char by char: str.lower() would turn a final Σ into ς
            n = "".join(_lower_char(x) for x in n)
        return n

    def normalize(self, text: str, base: int) -> tuple[str, list[int] | None]:
        """(normalised text, original position of each of its characters, offset by base); the positions are None
        when every char maps to exactly one char, so that they are unchanged."""
        if self.strip_accents and "mm" in text.translate(self.marks):
            return self._normalize_reordered(text, base)
        norm = text.translate(self.norm)
        widths = text.translate(self.width)
        if len(norm) == len(text) and widths.count("\x01") == len(text):
            return norm, None
        counts = np.frombuffer(widths.encode("latin-1"), dtype=np.uint8)
        return norm, np.repeat(np.arange(base, base + len(text)), counts).tolist()

    def one_to_one(self, text: str) -> str | None:
        """The normalised text when every char maps to exactly one char (so positions are unchanged), else None."""
        norm = text.translate(self.norm)
        if len(norm) != len(text) or text.translate(self.width).count("\x01") != len(text):
            return None
        if self.strip_accents and "mm" in text.translate(self.marks):
            return None
        return norm

    def _normalize_reordered(self, text: str, base: int) -> tuple[str, list[int]]:
        """Normalise text whose NFD needs canonical reordering of combining marks across characters, as the Rust
        tokenizer does: each char decomposes into (char, change) pairs (0 for its first char, 1 for those it adds);
        runs of nonzero-class marks are stably sorted by class, pairs moving together; then a change-0 char takes the
        position of the next source char, an added one that of the last taken: positions follow the sequence."""
        pairs: list[list] = []
        src: list[int] = []
        for i, c in enumerate(text, base):
            if _is_removed(c):
                continue
            src.append(i)
            d = " " if c in WHITESPACE else _nfd(c)
            pairs.extend([x, 1 if k else 0] for k, x in enumerate(d))
        k = 0
        while k < len(pairs):  # canonical ordering: stable sort of each run of non-starters by class
            if _ccc(pairs[k][0]):
                j = k
                while j < len(pairs) and _ccc(pairs[j][0]):
                    j += 1
                pairs[k:j] = sorted(pairs[k:j], key=lambda p: _ccc(p[0]))
                k = j
            else:
                k += 1
        chars: list[str] = []
        align: list[int] = []
        taken = 0
        for x, change in pairs:
            if change == 0:
                pos = src[taken]
                taken += 1
            else:
                pos = src[taken - 1] if taken else src[0]
            if _category(x) == "Mn":
                continue
            for y in (_lower_char(x) if self.lowercase else x):
                chars.append(y)
                align.append(pos)
        return "".join(chars), align


# Code points assigned in Unicode 8.0 (DerivedAge), as hex ranges; generated with perl's \p{In=8.0} over 0..0x10FFFF
_ASSIGNED_IN_UNICODE_8 = (
    "0-377 37A-37F 384-38A 38C 38E-3A1 3A3-52F 531-556 559-55F 561-587 589-58A 58D-58F 591-5C7 5D0-5EA 5F0-5F4 "
    "600-61C 61E-70D 70F-74A 74D-7B1 7C0-7FA 800-82D 830-83E 840-85B 85E 8A0-8B4 8E3-983 985-98C 98F-990 993-9A8 "
    "9AA-9B0 9B2 9B6-9B9 9BC-9C4 9C7-9C8 9CB-9CE 9D7 9DC-9DD 9DF-9E3 9E6-9FB A01-A03 A05-A0A A0F-A10 A13-A28 A2A-A30 "
    "A32-A33 A35-A36 A38-A39 A3C A3E-A42 A47-A48 A4B-A4D A51 A59-A5C A5E A66-A75 A81-A83 A85-A8D A8F-A91 A93-AA8 "
    "AAA-AB0 AB2-AB3 AB5-AB9 ABC-AC5 AC7-AC9 ACB-ACD AD0 AE0-AE3 AE6-AF1 AF9 B01-B03 B05-B0C B0F-B10 B13-B28 B2A-B30 "
    "B32-B33 B35-B39 B3C-B44 B47-B48 B4B-B4D B56-B57 B5C-B5D B5F-B63 B66-B77 B82-B83 B85-B8A B8E-B90 B92-B95 B99-B9A "
    "B9C B9E-B9F BA3-BA4 BA8-BAA BAE-BB9 BBE-BC2 BC6-BC8 BCA-BCD BD0 BD7 BE6-BFA C00-C03 C05-C0C C0E-C10 C12-C28 "
    "C2A-C39 C3D-C44 C46-C48 C4A-C4D C55-C56 C58-C5A C60-C63 C66-C6F C78-C7F C81-C83 C85-C8C C8E-C90 C92-CA8 CAA-CB3 "
    "CB5-CB9 CBC-CC4 CC6-CC8 CCA-CCD CD5-CD6 CDE CE0-CE3 CE6-CEF CF1-CF2 D01-D03 D05-D0C D0E-D10 D12-D3A D3D-D44 "
    "D46-D48 D4A-D4E D57 D5F-D63 D66-D75 D79-D7F D82-D83 D85-D96 D9A-DB1 DB3-DBB DBD DC0-DC6 DCA DCF-DD4 DD6 DD8-DDF "
    "DE6-DEF DF2-DF4 E01-E3A E3F-E5B E81-E82 E84 E87-E88 E8A E8D E94-E97 E99-E9F EA1-EA3 EA5 EA7 EAA-EAB EAD-EB9 "
    "EBB-EBD EC0-EC4 EC6 EC8-ECD ED0-ED9 EDC-EDF F00-F47 F49-F6C F71-F97 F99-FBC FBE-FCC FCE-FDA 1000-10C5 10C7 10CD "
    "10D0-1248 124A-124D 1250-1256 1258 125A-125D 1260-1288 128A-128D 1290-12B0 12B2-12B5 12B8-12BE 12C0 12C2-12C5 "
    "12C8-12D6 12D8-1310 1312-1315 1318-135A 135D-137C 1380-1399 13A0-13F5 13F8-13FD 1400-169C 16A0-16F8 1700-170C "
    "170E-1714 1720-1736 1740-1753 1760-176C 176E-1770 1772-1773 1780-17DD 17E0-17E9 17F0-17F9 1800-180E 1810-1819 "
    "1820-1877 1880-18AA 18B0-18F5 1900-191E 1920-192B 1930-193B 1940 1944-196D 1970-1974 1980-19AB 19B0-19C9 "
    "19D0-19DA 19DE-1A1B 1A1E-1A5E 1A60-1A7C 1A7F-1A89 1A90-1A99 1AA0-1AAD 1AB0-1ABE 1B00-1B4B 1B50-1B7C 1B80-1BF3 "
    "1BFC-1C37 1C3B-1C49 1C4D-1C7F 1CC0-1CC7 1CD0-1CF6 1CF8-1CF9 1D00-1DF5 1DFC-1F15 1F18-1F1D 1F20-1F45 1F48-1F4D "
    "1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 1FB6-1FC4 1FC6-1FD3 1FD6-1FDB 1FDD-1FEF 1FF2-1FF4 1FF6-1FFE "
    "2000-2064 2066-2071 2074-208E 2090-209C 20A0-20BE 20D0-20F0 2100-218B 2190-23FA 2400-2426 2440-244A 2460-2B73 "
    "2B76-2B95 2B98-2BB9 2BBD-2BC8 2BCA-2BD1 2BEC-2BEF 2C00-2C2E 2C30-2C5E 2C60-2CF3 2CF9-2D25 2D27 2D2D 2D30-2D67 "
    "2D6F-2D70 2D7F-2D96 2DA0-2DA6 2DA8-2DAE 2DB0-2DB6 2DB8-2DBE 2DC0-2DC6 2DC8-2DCE 2DD0-2DD6 2DD8-2DDE 2DE0-2E42 "
    "2E80-2E99 2E9B-2EF3 2F00-2FD5 2FF0-2FFB 3000-303F 3041-3096 3099-30FF 3105-312D 3131-318E 3190-31BA 31C0-31E3 "
    "31F0-321E 3220-32FE 3300-4DB5 4DC0-9FD5 A000-A48C A490-A4C6 A4D0-A62B A640-A6F7 A700-A7AD A7B0-A7B7 A7F7-A82B "
    "A830-A839 A840-A877 A880-A8C4 A8CE-A8D9 A8E0-A8FD A900-A953 A95F-A97C A980-A9CD A9CF-A9D9 A9DE-A9FE AA00-AA36 "
    "AA40-AA4D AA50-AA59 AA5C-AAC2 AADB-AAF6 AB01-AB06 AB09-AB0E AB11-AB16 AB20-AB26 AB28-AB2E AB30-AB65 AB70-ABED "
    "ABF0-ABF9 AC00-D7A3 D7B0-D7C6 D7CB-D7FB E000-FA6D FA70-FAD9 FB00-FB06 FB13-FB17 FB1D-FB36 FB38-FB3C FB3E "
    "FB40-FB41 FB43-FB44 FB46-FBC1 FBD3-FD3F FD50-FD8F FD92-FDC7 FDD0-FDFD FE00-FE19 FE20-FE52 FE54-FE66 FE68-FE6B "
    "FE70-FE74 FE76-FEFC FEFF FF01-FFBE FFC2-FFC7 FFCA-FFCF FFD2-FFD7 FFDA-FFDC FFE0-FFE6 FFE8-FFEE FFF9-1000B "
    "1000D-10026 10028-1003A 1003C-1003D 1003F-1004D 10050-1005D 10080-100FA 10100-10102 10107-10133 10137-1018C "
    "10190-1019B 101A0 101D0-101FD 10280-1029C 102A0-102D0 102E0-102FB 10300-10323 10330-1034A 10350-1037A "
    "10380-1039D 1039F-103C3 103C8-103D5 10400-1049D 104A0-104A9 10500-10527 10530-10563 1056F 10600-10736 "
    "10740-10755 10760-10767 10800-10805 10808 1080A-10835 10837-10838 1083C 1083F-10855 10857-1089E 108A7-108AF "
    "108E0-108F2 108F4-108F5 108FB-1091B 1091F-10939 1093F 10980-109B7 109BC-109CF 109D2-10A03 10A05-10A06 "
    "10A0C-10A13 10A15-10A17 10A19-10A33 10A38-10A3A 10A3F-10A47 10A50-10A58 10A60-10A9F 10AC0-10AE6 10AEB-10AF6 "
    "10B00-10B35 10B39-10B55 10B58-10B72 10B78-10B91 10B99-10B9C 10BA9-10BAF 10C00-10C48 10C80-10CB2 10CC0-10CF2 "
    "10CFA-10CFF 10E60-10E7E 11000-1104D 11052-1106F 1107F-110C1 110D0-110E8 110F0-110F9 11100-11134 11136-11143 "
    "11150-11176 11180-111CD 111D0-111DF 111E1-111F4 11200-11211 11213-1123D 11280-11286 11288 1128A-1128D "
    "1128F-1129D 1129F-112A9 112B0-112EA 112F0-112F9 11300-11303 11305-1130C 1130F-11310 11313-11328 1132A-11330 "
    "11332-11333 11335-11339 1133C-11344 11347-11348 1134B-1134D 11350 11357 1135D-11363 11366-1136C 11370-11374 "
    "11480-114C7 114D0-114D9 11580-115B5 115B8-115DD 11600-11644 11650-11659 11680-116B7 116C0-116C9 11700-11719 "
    "1171D-1172B 11730-1173F 118A0-118F2 118FF 11AC0-11AF8 12000-12399 12400-1246E 12470-12474 12480-12543 "
    "13000-1342E 14400-14646 16800-16A38 16A40-16A5E 16A60-16A69 16A6E-16A6F 16AD0-16AED 16AF0-16AF5 16B00-16B45 "
    "16B50-16B59 16B5B-16B61 16B63-16B77 16B7D-16B8F 16F00-16F44 16F50-16F7E 16F8F-16F9F 1B000-1B001 1BC00-1BC6A "
    "1BC70-1BC7C 1BC80-1BC88 1BC90-1BC99 1BC9C-1BCA3 1D000-1D0F5 1D100-1D126 1D129-1D1E8 1D200-1D245 1D300-1D356 "
    "1D360-1D371 1D400-1D454 1D456-1D49C 1D49E-1D49F 1D4A2 1D4A5-1D4A6 1D4A9-1D4AC 1D4AE-1D4B9 1D4BB 1D4BD-1D4C3 "
    "1D4C5-1D505 1D507-1D50A 1D50D-1D514 1D516-1D51C 1D51E-1D539 1D53B-1D53E 1D540-1D544 1D546 1D54A-1D550 "
    "1D552-1D6A5 1D6A8-1D7CB 1D7CE-1DA8B 1DA9B-1DA9F 1DAA1-1DAAF 1E800-1E8C4 1E8C7-1E8D6 1EE00-1EE03 1EE05-1EE1F "
    "1EE21-1EE22 1EE24 1EE27 1EE29-1EE32 1EE34-1EE37 1EE39 1EE3B 1EE42 1EE47 1EE49 1EE4B 1EE4D-1EE4F 1EE51-1EE52 "
    "1EE54 1EE57 1EE59 1EE5B 1EE5D 1EE5F 1EE61-1EE62 1EE64 1EE67-1EE6A 1EE6C-1EE72 1EE74-1EE77 1EE79-1EE7C 1EE7E "
    "1EE80-1EE89 1EE8B-1EE9B 1EEA1-1EEA3 1EEA5-1EEA9 1EEAB-1EEBB 1EEF0-1EEF1 1F000-1F02B 1F030-1F093 1F0A0-1F0AE "
    "1F0B1-1F0BF 1F0C1-1F0CF 1F0D1-1F0F5 1F100-1F10C 1F110-1F12E 1F130-1F16B 1F170-1F19A 1F1E6-1F202 1F210-1F23A "
    "1F240-1F248 1F250-1F251 1F300-1F579 1F57B-1F5A3 1F5A5-1F6D0 1F6E0-1F6EC 1F6F0-1F6F3 1F700-1F773 1F780-1F7D4 "
    "1F800-1F80B 1F810-1F847 1F850-1F859 1F860-1F887 1F890-1F8AD 1F910-1F918 1F980-1F984 1F9C0 1FFFE-2A6D6 "
    "2A700-2B734 2B740-2B81D 2B820-2CEA1 2F800-2FA1D 2FFFE-2FFFF 3FFFE-3FFFF 4FFFE-4FFFF 5FFFE-5FFFF 6FFFE-6FFFF "
    "7FFFE-7FFFF 8FFFE-8FFFF 9FFFE-9FFFF AFFFE-AFFFF BFFFE-BFFFF CFFFE-CFFFF DFFFE-DFFFF E0001 E0020-E007F "
    "E0100-E01EF EFFFE-10FFFF "
)

# is_punct's non-ASCII chars (hex ranges) for the fast regex; precomputed, deriving it is slow (docs/performance.md)
PUNCT_UNICODE_8 = (
    "A1 A7 AB B6-B7 BB BF 37E 387 55A-55F 589-58A 5BE 5C0 5C3 5C6 5F3-5F4 609-60A 60C-60D 61B 61E-61F 66A-66D 6D4 "
    "700-70D 7F7-7F9 830-83E 85E 964-965 970 AF0 DF4 E4F E5A-E5B F04-F12 F14 F3A-F3D F85 FD0-FD4 FD9-FDA 104A-104F "
    "10FB 1360-1368 1400 166D-166E 169B-169C 16EB-16ED 1735-1736 17D4-17D6 17D8-17DA 1800-180A 1944-1945 1A1E-1A1F "
    "1AA0-1AA6 1AA8-1AAD 1B5A-1B60 1BFC-1BFF 1C3B-1C3F 1C7E-1C7F 1CC0-1CC7 1CD3 2010-2027 2030-2043 2045-2051 "
    "2053-205E 207D-207E 208D-208E 2308-230B 2329-232A 2768-2775 27C5-27C6 27E6-27EF 2983-2998 29D8-29DB 29FC-29FD "
    "2CF9-2CFC 2CFE-2CFF 2D70 2E00-2E2E 2E30-2E42 3001-3003 3008-3011 3014-301F 3030 303D 30A0 30FB A4FE-A4FF "
    "A60D-A60F A673 A67E A6F2-A6F7 A874-A877 A8CE-A8CF A8F8-A8FA A8FC A92E-A92F A95F A9C1-A9CD A9DE-A9DF AA5C-AA5F "
    "AADE-AADF AAF0-AAF1 ABEB FD3E-FD3F FE10-FE19 FE30-FE52 FE54-FE61 FE63 FE68 FE6A-FE6B FF01-FF03 FF05-FF0A "
    "FF0C-FF0F FF1A-FF1B FF1F-FF20 FF3B-FF3D FF3F FF5B FF5D FF5F-FF65 10100-10102 1039F 103D0 1056F 10857 1091F 1093F "
    "10A50-10A58 10A7F 10AF0-10AF6 10B39-10B3F 10B99-10B9C 11047-1104D 110BB-110BC 110BE-110C1 11140-11143 "
    "11174-11175 111C5-111C9 111CD 111DB 111DD-111DF 11238-1123D 112A9 114C6 115C1-115D7 11641-11643 1173C-1173E "
    "12470-12474 16A6E-16A6F 16AF5 16B37-16B3B 16B44 1BC9F 1DA87-1DA8B "
)

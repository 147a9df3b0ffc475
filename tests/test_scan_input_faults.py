"""Scan readers on inputs that used to give a wrong machine or a wrong message (hunt F): each case is built from
a real capture in MOMENT_FIXTURES (skipped when absent) or written here."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
from conftest import fixture_file

from moment.errors import MomentError

from moment.topology.model import Kind
from moment.topology.scan import scan_files

ASUS_G4 = "dmidecode_linuxhw_asus-esc8000-g4.txt"
SYS_2029U = "dmidecode_linuxhw_supermicro-sys-2029u-tn24r4t.txt"
G482 = "dmidecode_linuxhw_gigabyte-g482-z54.txt"


def _slot(topo, label_start: str):
    return next(n for n in topo.of_kind(Kind.slot) if (n.label or "").startswith(label_start))


# ---- F1: a slot record without a generation -------------------------------------------------------------
@pytest.mark.parametrize("name, designation", [(ASUS_G4, "NGFF1"), (ASUS_G4, "OCUPCIE13"),
                                               (SYS_2029U, "RSC-UMR-8 M.2_PCIe")])
def test_slot_without_generation_takes_the_boards(name, designation):
    topo, report = scan_files(dmidecode=fixture_file(name))
    slot = _slot(topo, designation)
    assert slot.link.gen == 3  # every other record and the Xeon (Cascade Lake) say PCIe 3.0
    assert "PCIe 3.0 assumed" in slot.label
    assert any("no PCIe generation" in w and designation in w and "assumed PCIe 3.0" in w
               for w in report.warnings)


def test_slot_without_generation_takes_the_cpus_when_no_record_states_one():
    topo, report = scan_files(dmidecode=fixture_file(G482))  # EPYC 7302 (Rome): PCIe 4.0
    assert {n.link.gen for n in topo.of_kind(Kind.slot)} == {4}
    assert any("assumed PCIe 4.0, the CPU's (AMD EPYC 7302" in w for w in report.warnings)


def test_slot_generation_is_capped_by_the_cpu(tmp_path):
    text = fixture_file(ASUS_G4).read_text().replace("PCI Express 3 x16", "PCI Express 4 x16")
    (tmp_path / "g4.txt").write_text(text)
    topo, report = scan_files(dmidecode=tmp_path / "g4.txt")
    assert _slot(topo, "NGFF1").link.gen == 3
    assert any("the CPU's (Intel(R) Xeon(R) Silver 4214" in w for w in report.warnings)


# ---- F2: nvidia-smi with NUMA affinity N/A -------------------------------------------------------------
ESC_SMI = "nvidia-smi-topo_stelline_asus-esc8000a-e12.txt"


def _numa_na(tmp_path, cpu_too: bool):
    text = re.sub(r"(0-31|32-63)( +)(0|1) ", lambda m: ("N/A" if cpu_too else m.group(1)) + m.group(2) + "N/A",
                  fixture_file(ESC_SMI).read_text())
    assert text.count("N/A") >= 8
    (tmp_path / "na.txt").write_text(text)
    return tmp_path / "na.txt"


@pytest.mark.parametrize("cpu_too, how", [(False, "CPU affinities overlap"), (True, "not SYS to each other")])
def test_numa_na_sockets_from_cpu_affinity_or_sys(tmp_path, cpu_too, how):
    topo, report = scan_files(nvidia_smi=_numa_na(tmp_path, cpu_too))
    full, _ = scan_files(nvidia_smi=fixture_file(ESC_SMI))
    assert len(topo.of_kind(Kind.socket)) == 2
    assert len(topo.links) == len(full.links) == 1  # the socket link, as with the NUMA column filled

    def socket_of(t, gid):
        n = t.node(gid)
        while n.kind != Kind.socket:
            n = t.node(n.parent)
        return n.id

    assert [socket_of(topo, f"gpu{i}") for i in range(4)] == [socket_of(full, f"gpu{i}") for i in range(4)]
    assert any("NUMA affinity is N/A" in w and how in w for w in report.warnings)


# ---- F3: two outputs in one file ------------------------------------------------------------------------
WRX_SMI = "nvidia-smi-topo_stelline_puget-wrx90.txt"
C4140 = "dmidecode_linuxhw_dell-poweredge-c4140.txt"
TRT = "dmidecode_linuxhw_supermicro-sys-4029gp-trt.txt"


def test_two_matrices_in_one_file_are_refused(tmp_path):
    two = tmp_path / "two-nv.txt"
    two.write_text(fixture_file(WRX_SMI).read_text() + fixture_file(ESC_SMI).read_text())
    with pytest.raises(MomentError, match=r"two-nv.txt: holds two `nvidia-smi topo -m` matrices \(header lines 2 "
                                          r"and \d+\)"):
        scan_files(nvidia_smi=two)


def test_a_p2p_matrix_after_the_topology_matrix_is_not_a_second_one(tmp_path):
    p2p = ("$ nvidia-smi topo -p2p r\n \tGPU0\tGPU1\tGPU2\tGPU3\n GPU0\tX\tOK\tOK\tOK\n GPU1\tOK\tX\tOK\tOK\n"
           " GPU2\tOK\tOK\tX\tOK\n GPU3\tOK\tOK\tOK\tX\n")
    f = tmp_path / "log.txt"
    f.write_text(fixture_file(ESC_SMI).read_text() + p2p)
    topo, _ = scan_files(nvidia_smi=f)
    assert len(topo.of_kind(Kind.gpu)) == 4


@pytest.mark.parametrize("second", [TRT, C4140])
def test_two_smbios_tables_in_one_file_are_refused(tmp_path, second):
    two = tmp_path / "two-dmi.txt"
    two.write_text(fixture_file(C4140).read_text() + fixture_file(second).read_text())
    with pytest.raises(MomentError, match=r"two-dmi.txt: holds more than one SMBIOS table: record Handle 0x[0-9A-Fa-f]+ "
                                          r"appears at lines \d+ and \d+"):
        scan_files(dmidecode=two)


# ---- F4: a tree without device names -------------------------------------------------------------------
WRX_TV = "lspci-tv_stelline_puget-wrx90.txt"


@pytest.mark.parametrize("names", ["none", "ids"])
def test_tree_without_names_is_refused(tmp_path, names):
    tree = fixture_file(WRX_TV).read_text()
    if names == "none":  # `lspci -t`
        text = re.sub(r"(\.[0-7])  .*$", r"\1", tree, flags=re.M)
    else:  # `lspci -tvn`: ids instead of names
        text = re.sub(r"(\.[0-7])  .*$", r"\1  10de:2330", tree, flags=re.M)
    assert text != tree
    f = tmp_path / "lspci-t.txt"
    f.write_text(text)
    with pytest.raises(MomentError, match=r"(?s)lspci-t.txt: the tree has no device names .*save `lspci -tv` \(with -v"):
        scan_files(lspci=f)


# ---- F5: lines before a transcript's first prompt --------------------------------------------------------
ESC_DOC = "stelline_asus-esc8000a-e12.md"
ESC_TV = "lspci-tv_stelline_asus-esc8000a-e12.txt"


def test_section_before_the_first_prompt_is_read(tmp_path):
    lines = fixture_file(ESC_DOC).read_text().split("\n")
    a = next(i for i, ln in enumerate(lines) if "lspci -vvv -s 21:00.0" in ln)
    b = next(i for i, ln in enumerate(lines) if "lspci -vvv -s 81:00.0" in ln)
    end = next(i for i in range(b, len(lines)) if lines[i].startswith("```"))
    copy = [ln for ln in lines[a + 1:end] if not ln.startswith("```")]  # a copy begun below the first prompt
    assert copy[0].startswith("21:00.0") and any(ln.startswith("$ ") for ln in copy)
    f = tmp_path / "vv2.txt"
    f.write_text("\n".join(copy) + "\n")
    topo, _ = scan_files(lspci=fixture_file(ESC_TV), lspci_vvv=f)
    nics = {n.pci: n for n in topo.of_kind(Kind.nic)}
    assert nics["0000:21:00.0"].link.gen == nics["0000:81:00.0"].link.gen == 5


def test_matrix_before_the_first_prompt_is_read(tmp_path):
    smi = fixture_file(ESC_SMI).read_text().split("\n", 1)[1]  # without its prompt line
    tree = fixture_file(ESC_TV).read_text().split("\n", 1)[1]
    f = tmp_path / "mix.txt"
    f.write_text(smi + "$ lspci -tv\n" + tree)
    topo, report = scan_files(nvidia_smi=f, lspci=f)
    assert len(topo.of_kind(Kind.gpu)) == 4
    assert any("nvidia-smi topo -m" in u and "4 GPUs" in u for u in report.sources_used)


def test_markdown_list_before_a_tree_is_not_a_tree(tmp_path):
    f = tmp_path / "notes.md"
    f.write_text("- the tree of the ESC8000A:\n\n```\n$ lspci -tv\n" + fixture_file(ESC_TV).read_text().split("\n", 1)[1])
    topo, _ = scan_files(lspci=f)
    assert len(topo.of_kind(Kind.gpu)) == 4


# ---- F11: UTF-16 text ----------------------------------------------------------------------------------
@pytest.mark.parametrize("option, name", [("nvidia_smi", ESC_SMI), ("lspci", WRX_TV), ("dmidecode", C4140)])
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le"])
def test_utf16_text_is_named(tmp_path, option, name, encoding):
    f = tmp_path / "u16.txt"
    f.write_bytes(fixture_file(name).read_text().encode(encoding))
    with pytest.raises(MomentError, match=r"(?s)u16.txt: the file is UTF-16 text.*-Encoding utf8"):
        scan_files(**{option: f})


# ---- F12: `-` reads standard input -----------------------------------------------------------------------
def _scan_stdin(monkeypatch, capsys, data: bytes, *argv: str):
    from moment.cli import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code = main(["scan", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_dash_reads_standard_input_once_for_every_option(monkeypatch, capsys):
    doc = fixture_file(ESC_DOC)
    code, out, _ = _scan_stdin(monkeypatch, capsys, doc.read_bytes(), "--from-lspci", "-", "--from-lspci-vvv", "-",
                               "--from-nvidia-smi", "-")
    assert code == 0
    piped = json.loads(out)
    from_file, _ = scan_files(lspci=doc, lspci_vvv=doc, nvidia_smi=doc)
    assert piped["nodes"] == json.loads(from_file.model_dump_json(exclude_none=True))["nodes"]
    assert "standard input" in piped["source"]


def test_dash_reads_xml_from_standard_input(monkeypatch, capsys):
    code, out, _ = _scan_stdin(monkeypatch, capsys, fixture_file("nccl_azure_ndv4-topo.xml").read_bytes(),
                               "--from-nccl-xml", "-")
    assert code == 0 and len([n for n in json.loads(out)["nodes"] if n["kind"] == "gpu"]) == 8


def test_dash_on_a_terminal_or_with_bad_text_is_one_message(monkeypatch, capsys):
    from moment.cli import main

    class Tty(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty(io.BytesIO(b"")))
    assert main(["scan", "--from-lspci", "-"]) == 2
    assert "standard input is a terminal; pipe" in capsys.readouterr().err
    code, _, err = _scan_stdin(monkeypatch, capsys, "x".encode("utf-16"), "--from-dmidecode", "-")
    assert code == 2 and "standard input: the file is UTF-16 text" in err and "Traceback" not in err


# ---- F7: dmidecode alone: a slot's socket, an M.2 socket's lanes, a designation's width -------------------
TRT2 = "dmidecode_linuxhw_supermicro-sys-4029gp-trt2.txt"


def test_slots_of_unknown_socket_are_named():
    topo, report = scan_files(dmidecode=fixture_file(G482))
    assert len(topo.of_kind(Kind.socket)) == 2
    warning = next(w for w in report.warnings if "the socket of" in w)
    assert "the socket of 23 slots is not in the records" in warning and "U2_P0_P0_A" in warning
    assert "put under cpu0, though the machine has 2 sockets" in warning
    assert not any("one assumed root complex per socket" in w for w in report.warnings)


def test_a_slot_naming_its_cpu_is_not_in_the_warning():
    _, report = scan_files(dmidecode=fixture_file(TRT2))  # every record says CPU1/CPU2
    assert not any("the socket of" in w for w in report.warnings)


def test_m2_socket_is_at_most_x4():
    topo, _ = scan_files(dmidecode=fixture_file(G482))
    assert _slot(topo, "U2_P1_P0_B").link.width == 4  # "32-bit M.2 Socket 3"


@pytest.mark.parametrize("name, designation, link, slot", [(TRT2, "CPU1 Slot7 PCI-E 3.0 X8", 8, 16),
                                                           (TRT, "PCH Slot7 PCI-E 3.0 X4", 4, 8)])
def test_designation_width_narrower_than_the_type_is_the_link(name, designation, link, slot):
    topo, _ = scan_files(dmidecode=fixture_file(name))
    s = _slot(topo, designation)
    assert (s.link.width, s.width) == (link, slot)


# ---- F8: a card trained faster than the default sits in a slot at least that fast ---------------------------
def test_slot_is_at_least_what_its_card_trained_at():
    doc = fixture_file(ESC_DOC)
    topo, _ = scan_files(lspci=doc, lspci_vvv=doc, nvidia_smi=doc)
    cx7 = [n for n in topo.of_kind(Kind.nic) if "ConnectX-7" in (n.label or "")]
    assert len(cx7) == 2
    for nic in cx7:  # LnkSta 32 GT/s x16; its root port is not in the capture
        assert nic.link.gen == 5
        assert topo.node(nic.parent).link.gen == 5


@pytest.mark.parametrize("sta_gts, slot_gen", [(32.0, 5), (2.5, 4), (None, 4)])
def test_slot_lower_bound_synthetic(sta_gts, slot_gen):
    from moment.topology.readers.pci import PciFunction, build_topology

    port = PciFunction(0, 0, 1, 1, name="root port", is_bridge=True, secondary=1, subordinate=1, numa=0)
    card = PciFunction(0, 1, 0, 0, name="Mellanox Technologies MT2910 Family [ConnectX-7]", class_code=0x0200,
                       vendor_id=0x15B3, device_id=0x1021, cap_gts=32.0, cap_width=16, sta_gts=sta_gts,
                       sta_width=16 if sta_gts else None, numa=0)
    topo = build_topology([port, card], name="t")
    nic = topo.of_kind(Kind.nic)[0]
    assert topo.node(nic.parent).kind == Kind.slot and topo.node(nic.parent).link.gen == slot_gen


# ---- F14: sysfs GPUs by their ids (the XML readers' table) -------------------------------------------------
def _fake_sysfs(root, device: str):
    for bdf, files in (("0000:00:01.0", {"class": "0x060400", "vendor": "0x8086", "device": "0x2030",
                                         "secondary_bus_number": "1", "subordinate_bus_number": "1"}),
                       ("0000:01:00.0", {"class": "0x030200", "vendor": "0x10de", "device": device})):
        d = root / bdf
        d.mkdir(parents=True)
        for k, v in files.items():
            (d / k).write_text(v + "\n")
    return root


@pytest.mark.parametrize("device, model, memory, hbm", [("0x2330", "H100-SXM5-80GB", 80, 3350),
                                                        ("0x20b2", "A100-SXM4-80GB", 80, 2039)])
def test_sysfs_gpu_model_from_its_ids(tmp_path, device, model, memory, hbm):
    from moment.topology.readers import sysfs
    from moment.topology.readers._xml_pci import GPU_MODELS

    topo = sysfs.read_sysfs(_fake_sysfs(tmp_path / "devices", device))
    gpu = topo.of_kind(Kind.gpu)[0]
    info = GPU_MODELS[(0x10DE, int(device, 16))]
    assert (gpu.model, gpu.memory_gib, gpu.hbm_gbps) == (model, memory, hbm) == (info.model, info.memory_gib,
                                                                                 info.hbm_gbps)


# ---- F14: the scan's text shows a peer link's label (what is assumed) ------------------------------------
def test_scan_text_shows_the_socket_links_assumed_label(capsys):
    from moment.cli import main

    assert main(["scan", "--from-hwloc-xml", str(fixture_file("hwloc_power8gpudistances.xml"))]) == 0
    out = capsys.readouterr().out
    assert "peer link cpu0 <-> cpu1: UPI x2 [IBM X-bus, modelled as UPI 2x (assumed)]" in out


# ---- F14: a negative NVLink count is named as negative, not as "not an integer" ------------------------------
@pytest.mark.parametrize("value, said", [("-2", r"is negative, out of range \(1\.\.1024\)"),
                                         ("--2", "is not an integer"), ("99999", r"is out of range \(1\.\.1024\)")])
def test_nccl_nvlink_count_message(tmp_path, value, said):
    from moment.topology.readers.nccl_xml import read_nccl_xml

    text = fixture_file("nccl_azure_ncv4-topo.xml").read_text()
    bad = re.sub(r'(<nvlink[^>]*count=")\d+', lambda m: m.group(1) + value, text, count=1)
    assert bad != text
    with pytest.raises(MomentError, match=rf"<nvlink>: count='{re.escape(value)}' {said}"):
        read_nccl_xml(bad.encode())

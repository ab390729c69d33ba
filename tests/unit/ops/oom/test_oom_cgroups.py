"""cgroup signals: discovery through /proc/PID/cgroup + mountinfo, and the v1 / v2 readings.

cgroup v2 is tested on a file tree laid out like procfs and cgroupfs, because this machine's unified
hierarchy has no memory controller (there is no real ``memory.current`` to read here). The code only opens
and reads these files, so a tree with the kernel's names and formats exercises exactly the paths it takes on
a v2 host. cgroup v1 is also read for real, from this process's own memory cgroup.
"""

from pathlib import Path

import pytest

from kvguardian.core.errors import UsageError
from kvguardian.ops.oom.signals import CgroupV1Signal, CgroupV2Signal, cgroup_signal, cgroup_signal_for_pid
from kvguardian.ops.oom.signals.cgroupfs import locate, parse_mountinfo, pod_cgroup

MOUNTINFO_V2 = (
    "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
    "30 22 0:26 {root} /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
)
MOUNTINFO_V1 = (
    "30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
    "36 30 0:32 / /sys/fs/cgroup/cpu\\040x rw,nosuid - cgroup cgroup rw,cpu\n"
)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(tmp: Path, *, cgroup="/kubepods/pod1/ctr", mount_root="/", current=900 << 20, inactive=100 << 20,
            own_max="max", parent_max=str(1 << 30), oom_kill=0) -> Path:
    write(tmp / "proc/self/cgroup", f"0::{cgroup}\n")
    write(tmp / "proc/self/mountinfo", MOUNTINFO_V2.format(root=mount_root))
    rel = cgroup[len(mount_root.rstrip("/")):].lstrip("/")
    d = tmp / "sys/fs/cgroup" / rel
    write(d / "memory.current", f"{current}\n")
    write(d / "memory.stat", f"anon {current - inactive}\nfile {inactive}\ninactive_file {inactive}\nactive_file 0\n")
    write(d / "memory.max", f"{own_max}\n")
    write(d / "memory.events", f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\n")
    write(d.parent / "memory.max", f"{parent_max}\n")
    write(d.parent / "memory.current", "0\n")
    return d


def test_v2_found_through_proc_self_cgroup_reads_working_set_over_the_tightest_limit(tmp_path):
    d = v2_tree(tmp_path, oom_kill=2)
    loc = locate("self", root=tmp_path)
    assert (loc.version, loc.path, loc.cgroup) == (2, d, "/kubepods/pod1/ctr")
    r = cgroup_signal_for_pid("self", root=tmp_path).read()
    assert r.ok and r.used == 800 << 20  # memory.current minus inactive_file
    assert r.limit == 1 << 30  # the child has no limit ("max"); its parent's applies
    assert r.ratio == pytest.approx(800 / 1024)
    assert r.extra["oom_kill"] == 2 and r.extra["inactive_file"] == 100 << 20
    assert "cgroup v2" in r.source


def test_v2_unlimited_everywhere_reads_as_no_limit(tmp_path):
    v2_tree(tmp_path, parent_max="max")
    r = cgroup_signal_for_pid("self", root=tmp_path).read()
    assert r.limit is None and r.ratio is None and r.used is not None


def test_v2_mount_showing_a_subtree_as_in_a_container(tmp_path):
    d = v2_tree(tmp_path, cgroup="/kubepods/pod1/ctr", mount_root="/kubepods/pod1")
    assert locate("self", root=tmp_path).path == d == tmp_path / "sys/fs/cgroup/ctr"


def test_cgroup_outside_the_mounts_view_is_refused_with_the_fix(tmp_path):
    v2_tree(tmp_path, cgroup="/kubepods/pod1/ctr", mount_root="/kubepods/pod1")
    write(tmp_path / "proc/self/cgroup", "0::/elsewhere/x\n")
    with pytest.raises(UsageError, match=r"no memory cgroup is visible.*--cgroup PATH"):
        locate("self", root=tmp_path)


def test_v2_without_the_memory_controller_falls_back_to_v1(tmp_path):
    write(tmp_path / "proc/self/cgroup", "4:memory:/grp\n0::/grp\n")
    write(tmp_path / "proc/self/mountinfo", MOUNTINFO_V2.format(root="/") + MOUNTINFO_V1.splitlines()[1] + "\n")
    (tmp_path / "sys/fs/cgroup/grp").mkdir(parents=True)  # v2 dir without memory.current
    v1 = tmp_path / "sys/fs/cgroup/memory/grp"
    write(v1 / "memory.usage_in_bytes", "1000\n")
    loc = locate("self", root=tmp_path)
    assert (loc.version, loc.path) == (1, v1)


def v1_dir(tmp: Path, *, usage=700 << 20, inactive=50 << 20, limit=str(9223372036854771712),
           hier=str(512 << 20), oom_kill=1) -> Path:
    d = tmp / "memory/grp"
    write(d / "memory.usage_in_bytes", f"{usage}\n")
    write(d / "memory.limit_in_bytes", f"{limit}\n")
    write(d / "memory.stat", f"cache {inactive}\nrss 0\nhierarchical_memory_limit {hier}\n"
                             f"total_inactive_file {inactive}\ninactive_file 1\n")
    write(d / "memory.oom_control", f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    return d


def test_v1_usage_minus_inactive_file_over_the_hierarchical_limit(tmp_path):
    r = CgroupV1Signal(v1_dir(tmp_path)).read()
    assert r.used == 650 << 20 and r.limit == 512 << 20 and r.extra["oom_kill"] == 1
    assert r.ratio == pytest.approx(650 / 512)


def test_v1_kernel_unlimited_value_reads_as_no_limit(tmp_path):
    d = v1_dir(tmp_path, hier=str(9223372036854771712))
    assert CgroupV1Signal(d).read().limit is None


def test_v1_for_real_from_this_process_own_cgroup():
    try:
        loc = locate("self")
    except UsageError as exc:
        pytest.skip(f"no memory cgroup visible here: {exc}")
    r = cgroup_signal_for_pid("self").read()
    assert r.ok and r.used is not None and r.used > 0 and r.source.startswith(str(loc.path))


def test_a_read_that_fails_later_is_a_reading_with_the_error_not_an_exception(tmp_path):
    d = v1_dir(tmp_path)
    sig = cgroup_signal(d)
    (d / "memory.usage_in_bytes").unlink()
    r = sig.read()
    assert not r.ok and r.used is None and "memory.usage_in_bytes" in r.error


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "nope", "does not exist"),
    (lambda tmp: tmp, "is not a memory cgroup"),
])
def test_bad_cgroup_paths_are_one_line_with_the_fix(tmp_path, make, message):
    with pytest.raises(UsageError, match=message) as err:
        cgroup_signal(make(tmp_path))
    assert "fix:" in str(err.value) and "\n" not in str(err.value)


def test_a_pid_that_does_not_exist_is_refused_with_the_fix(tmp_path):
    with pytest.raises(UsageError, match=r"process 424242: .* does not exist; fix: pass the PID"):
        locate(424242, root=tmp_path)


def test_wrong_version_class_is_refused(tmp_path):
    with pytest.raises(UsageError, match="cgroup v1 directory"):
        CgroupV2Signal(v1_dir(tmp_path))


def test_mountinfo_octal_escapes_are_decoded():
    mounts = parse_mountinfo(MOUNTINFO_V1)
    assert [m.point for m in mounts] == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu x"]
    assert "memory" in mounts[0].options


@pytest.mark.parametrize("layout", ["cgroupfs", "systemd"])
def test_pod_cgroup_by_uid_in_both_kubelet_drivers(tmp_path, layout):
    uid = "0a1b2c3d-1111-2222-3333-444455556666"
    if layout == "cgroupfs":
        d = tmp_path / "kubepods/burstable" / f"pod{uid}"
    else:
        d = (tmp_path / "kubepods.slice/kubepods-burstable.slice" /
             f"kubepods-burstable-pod{uid.replace('-', '_')}.slice")
    write(d / "memory.current", "5\n")
    (tmp_path / "kubepods/burstable/podffff").mkdir(parents=True, exist_ok=True)
    assert pod_cgroup(uid, tmp_path) == d


def test_pod_cgroup_refuses_bad_uid_and_missing_pod(tmp_path):
    with pytest.raises(UsageError, match="not a pod UID"):
        pod_cgroup("../../etc", tmp_path)
    with pytest.raises(UsageError, match="0 cgroup directories found"):
        pod_cgroup("0a1b2c3d-1111-2222-3333-444455556666", tmp_path)

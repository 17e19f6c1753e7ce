"""process_id: this process's id, kept current across forks without a system call."""

import os

from app.process import process_id


def test_it_is_this_process_id() -> None:
    assert process_id() == os.getpid()


def test_a_forked_child_reads_its_own_id() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report, and leave without running pytest's exit
        os.write(write, str(process_id()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as report:
        assert int(report.read()) == child
    assert process_id() == os.getpid()

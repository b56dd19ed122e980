"""XSpace message classes for tests and the benchmark baseline, built at run
time from proto/xplane.proto through `protoc --descriptor_set_out` (no
generated code, so any protobuf runtime version works)."""

import os
import pathlib
import subprocess
import tempfile

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROOT = pathlib.Path(__file__).resolve().parents[2]


def xspace_class():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "xplane.desc")
        subprocess.run(
            ["protoc", f"--proto_path={ROOT / 'proto' / 'proto'}", f"--descriptor_set_out={out}", "xplane.proto"],
            check=True,
        )
        fds = descriptor_pb2.FileDescriptorSet.FromString(pathlib.Path(out).read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.profiler.XSpace"))

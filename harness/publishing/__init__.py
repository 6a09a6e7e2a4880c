"""From proven wheels to an index, all or nothing.

abi_audit  a wheel's op library audited for PyTorch's stable ABI
index      the index client: where to publish and what the index holds
publish    the sdist and one wheel per target, checked and uploaded one at a time
"""

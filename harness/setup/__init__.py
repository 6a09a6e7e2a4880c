"""The host set up, and the images every build and run starts from.

host        Docker daemon, QEMU binfmt registration, debootstrap, apt packages
wheels      wheels for a target's images, downloaded on the host; a wheel's metadata and sha256
images      base/test/build images, tagged by a hash of their inputs
containers  the harness's containers, labelled with their run; what a killed run left behind
tools       the host-side build tools (cibuildwheel, the build backend) and their pins
"""

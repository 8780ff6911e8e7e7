# nooelint: oelint.var.suggestedvar.BUGTRACKER,oelint.var.suggestedvar.CVE_PRODUCT
# (No public bug tracker; an image is not a product CVEs name, its packages are.)
SUMMARY = "A small systemd image that boots into the edgellm appliance"
DESCRIPTION = "The boot packages plus edgellm, its default model and systemd as init \
               (INIT_MANAGER = \"systemd\" in the distro or local.conf: the kas files set it)."
SECTION = "images"
LICENSE = "MIT"

inherit core-image features_check

REQUIRED_DISTRO_FEATURES = "systemd"

IMAGE_INSTALL = "\
    packagegroup-core-boot \
    packagegroup-edgellm \
    ${CORE_IMAGE_EXTRA_INSTALL} \
"
IMAGE_LINGUAS = ""

# The rootfs counts the model (0.5-1.1 GiB); leave room (KiB) for session snapshots in
# /var/lib/edgellm (~57 MiB each for the 1.5B at ctx 2048).
IMAGE_ROOTFS_EXTRA_SPACE = "262144"

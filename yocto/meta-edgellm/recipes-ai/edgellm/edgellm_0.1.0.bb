# nooelint: oelint.var.bbclassextend,oelint.var.suggestedvar.BUGTRACKER,oelint.var.mandatoryvar.HOMEPAGE
# (A target daemon with a systemd unit and a user: no native or nativesdk variant. edgellm has
# no public home page or bug tracker yet; its README.md travels with the sources.)
SUMMARY = "Offline LLM appliance daemon for ARM SoCs"
DESCRIPTION = "edgellm runs Q4 GGUF language models on ARM SoCs with NEON kernels, \
               answers prompts over MQTT and serial lines, and persists KV caches to flash."
SECTION = "ai"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57"
CVE_PRODUCT = "edgellm"

# The commit built, pinned: the sources and edgellm-crates.inc (generated from this commit's
# Cargo.lock) always agree, and the recipe parses wherever the layer is copied to. Change it
# with yocto/scripts/bump-srcrev.sh, which refuses a commit whose Cargo.lock the .inc does not
# list. There is no public repository: the sources come from a git mirror of your own (in
# local.conf or a kas local_conf_header; README.md):
#   EDGELLM_GIT_URI = "git://git.example.com/edgellm.git;protocol=https;branch=main"
# or, with EDGELLM_FROM_CHECKOUT = "1", from the git repository this layer sits in (an edgellm
# checkout holds it at yocto/meta-edgellm), at the commit it is checked out at: see
# edgellm-checkout.inc and yocto/kas/edgellm-checkout.yml.
PV = "0.1.0+git"
SRC_URI = "${EDGELLM_GIT_URI}"
SRCREV = "ea42aacb07cf28f71d0548519ff90dde2fb89cf3"
# Cargo.lock of SRCREV: sha256 356ab2df1c13cd5376d3a99c837bde298e2fec0559df064acdb8908a26e317a3
EDGELLM_GIT_URI ??= ""
# (The layer's own switch, not a misspelt variable of oe-core.)
# nooelint: oelint.vars.mispell.unknown
EDGELLM_FROM_CHECKOUT ??= "0"
require ${@'edgellm-checkout.inc' if d.getVar('EDGELLM_FROM_CHECKOUT') == '1' else ''}
# Without a source (a mirror, this checkout, or externalsrc's tree) the recipe is skipped,
# saying why, rather than failing the parse of every image that has the layer.
SKIP_RECIPE[edgellm] = "${@'' if d.getVar('EDGELLM_GIT_URI') or d.getVar('EXTERNALSRC') else 'it has no source: set EDGELLM_GIT_URI to a git mirror of edgellm, or EDGELLM_FROM_CHECKOUT to 1 to build the checkout this layer sits in (meta-edgellm README.md)'}"

inherit cargo cargo-update-recipe-crates systemd useradd

require ${BPN}-crates.inc

# The crate's default features include embedded-broker: build with none of them and add back
# what PACKAGECONFIG asks for (cargo.bbclass passes PACKAGECONFIG_CONFARGS to `cargo build`).
# An image whose daemons talk to a site broker drops it: PACKAGECONFIG:remove:pn-edgellm.
CARGO_BUILD_FLAGS += "--no-default-features"
PACKAGECONFIG ??= "embedded-broker"
PACKAGECONFIG[embedded-broker] = "--features embedded-broker,,"

USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system edgellm"
# dialout: the serial ports the daemon answers on. The home is the unit's StateDirectory=.
USERADD_PARAM:${PN} = "--system --gid edgellm --groups dialout \
                       --home-dir ${localstatedir}/lib/edgellm --no-create-home \
                       --shell ${base_sbindir}/nologin edgellm"

SYSTEMD_SERVICE:${PN} = "edgellm.service"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    # The unit names Debian's paths; this distro's may differ.
    sed -e 's,/usr/bin/,${bindir}/,g' -e 's,/etc/edgellm/,${sysconfdir}/edgellm/,g' \
        ${S}/board/systemd/edgellm.service > ${D}${systemd_system_unitdir}/edgellm.service
    chmod 0644 ${D}${systemd_system_unitdir}/edgellm.service
    # Modbus TCP on port 502 by socket activation; installed, not enabled.
    install -m 0644 ${S}/board/systemd/edgellm-modbus.socket ${D}${systemd_system_unitdir}/

    # The USB serial cores, loaded before the unit starts (its DeviceAllow=char-ttyUSB).
    install -d ${D}${nonarch_libdir}/modules-load.d
    install -m 0644 ${S}/board/systemd/modules-load.conf ${D}${nonarch_libdir}/modules-load.d/edgellm.conf

    # Readable by the daemon's group only: it may name broker credentials.
    install -d ${D}${sysconfdir}/edgellm
    install -m 0640 -g edgellm ${S}/board/systemd/edgellm.toml ${D}${sysconfdir}/edgellm/edgellm.toml
}

CONFFILES:${PN} = "${sysconfdir}/edgellm/edgellm.toml"
FILES:${PN} += "${nonarch_libdir}/modules-load.d/edgellm.conf ${systemd_system_unitdir}/edgellm-modbus.socket"
RRECOMMENDS:${PN} += "kernel-module-usbserial kernel-module-cdc-acm"

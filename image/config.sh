# shellcheck shell=bash
# Fixed inputs of the image build. Changing anything here changes the cache keys of the stages that read it.

SUITE=bookworm
ARCH=arm64
# raspi-firmware and the Broadcom Wi-Fi firmware live in non-free-firmware since bookworm.
COMPONENTS="main non-free-firmware"
# mmdebstrap's SOURCE_DATE_EPOCH for the cached rootfs (2024-01-01T00:00:00Z). Final trees are clamped to the build's
# SOURCE_DATE_EPOCH (default: the commit time of HEAD), which is always later.
ROOTFS_EPOCH=1704067200

# Partition and filesystem identities are fixed so that two builds agree (and fstab/cmdline can name them).
BOOT_LABEL=RASPIFIRM
ROOT_LABEL=RASPIROOT
BOOT_VOLID=2a5e0001
ROOT_UUID=6a1f0e5c-8b0d-4c1e-9a57-a9911a7ce001
DISK_ID=0x2a5e0001
# Sizes in MiB. The root filesystem is sized to its content plus ROOT_FREE_MIB; first boot grows it to the card.
PART_OFFSET_MIB=4
BOOT_MIB=256
ROOT_FREE_MIB=256

# Where the appliance lives on the device.
APPLIANCE_PREFIX=/opt/appliance

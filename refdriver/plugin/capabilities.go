package plugin

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// validateCapability says why the plugin cannot serve a volume with capability c, or "" when
// it can: a mounted file system (any fs_type is accepted and ignored, the mounter serves a
// folder) written from one node, or from several.
func validateCapability(c *csi.VolumeCapability) string {
	if c == nil {
		return "a volume capability is empty"
	}
	if c.GetBlock() != nil {
		return "block volumes are not supported: the volumes are file systems (access type mount)"
	}
	if c.GetMount() == nil {
		return "the access type is missing: want mount"
	}
	switch m := c.GetAccessMode().GetMode(); m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return ""
	default:
		return fmt.Sprintf("access mode %s is not supported: want SINGLE_NODE_WRITER, MULTI_NODE_SINGLE_WRITER or MULTI_NODE_MULTI_WRITER", m)
	}
}

// validateCapabilities checks every capability of a request; "" when all are served.
func validateCapabilities(caps []*csi.VolumeCapability) string {
	if len(caps) == 0 {
		return "volume_capabilities is required"
	}
	for i, c := range caps {
		if why := validateCapability(c); why != "" {
			return fmt.Sprintf("volume_capabilities[%d]: %s", i, why)
		}
	}
	return ""
}

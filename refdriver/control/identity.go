package control

import "cmp"

// Identity is what a reference driver reports about itself, in either mode; both modes' Options
// embed it. Zero values take the defaults documented on each field.
type Identity struct {
	// DriverName is the name reported by GetIdentity (and by GetPluginInfo in real mode). The
	// simulated mode puts it in its staging paths, the real mode in its mount sources.
	// Default: "healer.example.com".
	DriverName string

	// VendorVersion is reported by GetIdentity (and by GetPluginInfo in real mode).
	// Default: "v0.0.0-reference".
	VendorVersion string

	// NodeID names the node the driver plays, reported in the CSI-Addons identity manifest under
	// "nodeID" (and by NodeGetInfo in real mode). Default: "node-1".
	NodeID string
}

// WithDefaults returns the identity with its empty fields set to their defaults.
func (id Identity) WithDefaults() Identity {
	return Identity{
		DriverName:    cmp.Or(id.DriverName, "healer.example.com"),
		VendorVersion: cmp.Or(id.VendorVersion, "v0.0.0-reference"),
		NodeID:        cmp.Or(id.NodeID, "node-1"),
	}
}

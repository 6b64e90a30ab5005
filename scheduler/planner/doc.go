// Package planner selects the volumes of a sweep from shared informer caches, with no request to
// the API server: by driver and node (restart sweeps), by StorageClass (periodic sweeps), by PV
// (manual sweeps), or from the list a sidecar reports for drivers without VolumeAttachments. It
// applies the built-in guards (a volume that is detaching or deleted is skipped) and re-checks
// them right before a call.
//
// The caches hold compact records of PVs, PVCs and VolumeAttachments (cached.go, CacheTransform)
// rather than API objects, to keep the controller's memory small at 100,000 volumes; a Volume
// builds the policy input straight from them.
//
// It imports the policy package for the input types only; it must not import trigger, dispatch,
// probe or healer.
package planner

// Package nodeprobe is the sidecar's own probe of a volume, for drivers that serve no ProbeVolume:
// it finds the volume's staging path and publish targets in kubelet's records on the node (the
// vol_data.json files kubelet writes beside them), looks them up in the mount table
// (driverkit.ReadMountTable, the project's one reader) and stats each mount in a child process
// killed at a deadline, so that a frozen mount never leaves a goroutine or a process behind. It
// answers in driverkit's findings, the vocabulary a driver built on driverkit reports. A raw block
// volume is found in kubelet's volumeDevices records, and each pod's device is read, in the same
// kind of child, instead of stat'ed.
//
// It also lists the volumes of a driver that kubelet records on the node, for drivers that do not
// list their staged volumes themselves.
//
// It reads files and stats paths, and changes nothing on the node. It is part of the sidecar: it
// must not import the controller's packages (scheduler, policy, probe, healer).
package nodeprobe
